"""Synthetic agentic plays: a main agent's LLM calls over one growing context, tool waits between
them, and seeded sub-agents spawned off a turn (blocking ones joined back into the next turn).

Play p (`play{p}`) starts at `p x play_interval_ms`. Its main session `play{p}:main` makes
T = max(1, turns_per_play) calls `play{p}:main:t{k}`:

* turn 0 reads the system prompt and a first user message; turn k+1 reads turn k's input, turn
  k's output and a tool output, and waits for turn k's completion plus a tool time (a
  completion edge, relation "sequence", delay = the tool time);
* after turn k < T-1, with `subagent_probability`, a sub-agent session `play{p}:sub{k}` of
  `subagent_turns` calls starts from the system prompt and its own first user message and grows
  the same way. Its first call is spawned when main turn k completes, the tool call that
  launches it being in that turn's output (completion edge, relation "spawn", delay 0); it
  then runs beside the main agent's tool wait and next turns. With
  `subagent_blocking_probability` it is blocking: main turn k+1 also waits for the sub-agent's
  last call (completion edge, relation "join", delay 0).

Prompt content is trace hash ids, one per `trace_block_size` tokens of a session's token stream.
The full blocks of the system prompt have the same ids in every session of every play (the
shared prefix); every other full block gets an id of its own the first time the stream fills
it and keeps it for the rest of the session, so a turn's ids start with the previous turn's
full-block ids. A partial tail block gets an id unique to its request, since the next turn
writes more tokens into it. Ids count up from 0 in generation order and do not use the rng.

Draws, all from the one generator passed in, in this fixed order (L(x) = `sample_length`):
for each play: L(turns_per_play), L(first_user_tokens); then for each main turn k:
L(output_tokens), and when k < T-1: L(tool_output_tokens), L(tool_time_ms), u_spawn; when
u_spawn < subagent_probability: u_blocking, then the sub-agent's L(first_user_tokens) and, per
sub-agent call j, L(output_tokens) and when j is not its last call L(tool_output_tokens),
L(tool_time_ms). The u are `rng.random()` in [0, 1), so probabilities 0 and 1 are exact. A
first user message is at least 1 token so no call has an empty prompt.

Nothing here was recorded, so `recorded_api_time_ms` stays None; `recorded_start_ms` is a
static estimate that gives snapshot cuts a span: a root at its `not_before_ms`, any other call
at the latest of its edges' trigger times plus their delays, where a dispatch trigger is the
predecessor's estimated start and a completion trigger (a spawn included) that start plus a
nominal call time of
`NOMINAL_CALL_MS + NOMINAL_MS_PER_OUTPUT_TOKEN x output tokens`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from servesim.config.schema import AgenticSyntheticWorkload
from servesim.workload.agentic_graph import AgenticGraph, Dependency, Node, Play, check_acyclic
from servesim.workload.synthetic import sample_length

__all__ = ["NOMINAL_CALL_MS", "NOMINAL_MS_PER_OUTPUT_TOKEN", "generate_agentic"]

PATH = "synthetic agentic workload"
# a rough call time for the start estimates only (never used as a recorded API time): a
# prefill-sized overhead plus 20 ms per output token (about 50 tokens/s of decode)
NOMINAL_CALL_MS = 100.0
NOMINAL_MS_PER_OUTPUT_TOKEN = 20.0


def nominal_call_ms(output_tokens: int) -> float:
    """The nominal duration (ms) of a call producing `output_tokens`, for start estimates."""
    return NOMINAL_CALL_MS + NOMINAL_MS_PER_OUTPUT_TOKEN * output_tokens


def _completion_ms(node: Node) -> float:
    """A node's estimated completion: its estimated start plus the nominal call time."""
    assert node.recorded_start_ms is not None
    return node.recorded_start_ms + nominal_call_ms(node.output_length)


class _Context:
    """One session's growing token stream as trace blocks: a full block keeps its id for the
    rest of the session, a partial tail block gets a fresh id on every request."""

    def __init__(
        self, system_ids: tuple[int, ...], system_tokens: int, block_size: int, fresh: Iterator[int]
    ) -> None:
        self.full = list(system_ids)
        self.length = system_tokens
        self.block_size = block_size
        self.fresh = fresh

    def grow(self, n_tokens: int) -> None:
        self.length += n_tokens

    def hash_ids(self) -> tuple[int, ...]:
        n_full = self.length // self.block_size
        while len(self.full) < n_full:
            self.full.append(next(self.fresh))
        tail = (next(self.fresh),) if self.length % self.block_size else ()
        return (*self.full, *tail)


# called after the tool draws of a gap k < T-1 of the main session with (turn k's node, its
# estimated start); returns the sub-agent's nodes and the extra edges into turn k+1
Spawn = Callable[[int, Node, float], tuple[list[Node], list[Dependency]]]


def _session(
    cfg: AgenticSyntheticWorkload,
    rng: np.random.Generator,
    ctx: _Context,
    session_id: str,
    play_id: str,
    n_turns: int,
    first_deps: tuple[Dependency, ...],
    start_ms: float,
    not_before_ms: float | None,
    line: Iterator[int],
    spawn: Spawn | None = None,
) -> list[Node]:
    """The calls of one session, its first at `start_ms` (estimate), with any sub-agents a
    `spawn` adds after a turn placed right after that turn."""
    nodes: list[Node] = []
    deps = first_deps
    for k in range(n_turns):
        out = sample_length(cfg.output_tokens, rng)
        node = Node(
            request_id=f"{session_id}:t{k}",
            session_id=session_id,
            model=None,
            input_length=ctx.length,
            output_length=out,
            hash_ids=ctx.hash_ids(),
            not_before_ms=not_before_ms if k == 0 else None,
            dependencies=deps,
            play_id=play_id,
            line=next(line),
            recorded_start_ms=start_ms,
        )
        nodes.append(node)
        if k == n_turns - 1:
            break
        ctx.grow(out + sample_length(cfg.tool_output_tokens, rng))
        tool_ms = float(sample_length(cfg.tool_time_ms, rng))
        next_deps = [Dependency(node.request_id, "completion", tool_ms, "sequence")]
        next_start = _completion_ms(node) + tool_ms
        if spawn is not None:
            children, joins = spawn(k, node, start_ms)
            nodes.extend(children)
            next_deps.extend(joins)
            for d in joins:  # completion edges with delay 0
                pred = next(c for c in children if c.request_id == d.request_id)
                next_start = max(next_start, _completion_ms(pred))
        deps = tuple(next_deps)
        start_ms = next_start
    return nodes


def _play(
    cfg: AgenticSyntheticWorkload,
    rng: np.random.Generator,
    p: int,
    system_ids: tuple[int, ...],
    fresh: Iterator[int],
    line: Iterator[int],
) -> Play:
    play_id = f"play{p}"

    def context() -> _Context:
        ctx = _Context(system_ids, cfg.system_prompt_tokens, cfg.trace_block_size, fresh)
        ctx.grow(max(1, sample_length(cfg.first_user_tokens, rng)))
        return ctx

    def spawn(k: int, parent: Node, parent_start_ms: float) -> tuple[list[Node], list[Dependency]]:
        if not rng.random() < cfg.subagent_probability:
            return [], []
        blocking = rng.random() < cfg.subagent_blocking_probability
        children = _session(
            cfg,
            rng,
            context(),
            f"{play_id}:sub{k}",
            play_id,
            cfg.subagent_turns,
            (Dependency(parent.request_id, "completion", 0.0, "spawn"),),
            parent_start_ms + nominal_call_ms(parent.output_length),  # at the parent's end
            None,
            line,
        )
        joins = [Dependency(children[-1].request_id, "completion", 0.0, "join")] if blocking else []
        return children, joins

    start_ms = p * cfg.play_interval_ms
    n_turns = max(1, sample_length(cfg.turns_per_play, rng))
    nodes = _session(
        cfg,
        rng,
        context(),
        f"{play_id}:main",
        play_id,
        n_turns,
        (),
        start_ms,
        start_ms,
        line,
        spawn,
    )
    return Play(play_id, p, tuple(nodes))


def generate_agentic(cfg: AgenticSyntheticWorkload, rng: np.random.Generator) -> AgenticGraph:
    """`cfg.num_plays` seeded plays as a validated agentic graph (variant "synthetic")."""
    block_size = cfg.trace_block_size
    system_ids = tuple(range(cfg.system_prompt_tokens // block_size))
    fresh = itertools.count(len(system_ids))
    line = itertools.count(1)
    plays = tuple(_play(cfg, rng, p, system_ids, fresh, line) for p in range(cfg.num_plays))
    by_id = {n.request_id: n for play in plays for n in play.nodes}
    for play in plays:
        check_acyclic(Path(PATH), play.play_id, play.nodes, by_id)
    return AgenticGraph(
        plays=plays,
        block_size=block_size,
        path=PATH,
        variant="synthetic",
        source={"format": "agentic_synthetic", **cfg.model_dump(mode="json")},
        source_models=(),
        ordered_by_source=True,  # lanes take play0, play1, ... in generation order
        _by_id=by_id,
    )
