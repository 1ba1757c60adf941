"""A request: what the trace says it asks for, plus its mutable lifecycle on a worker.

Requests are data plus events, never processes: the worker that owns a request advances its
counters once per pass, and closed-loop drivers wait on its `done` event.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import simpy


class Status:
    PENDING: Final = 0  # created, not yet dispatched
    WAITING: Final = 1  # queued on a worker
    RUNNING: Final = 2
    DONE: Final = 3
    LOADING: Final = 4  # its prefix is being copied into G1 from a lower tier
    LANDED: Final = 5  # that copy is in G1: admitted once the rest of its blocks fit


class Request:
    """One LLM call. Times are simulated milliseconds."""

    __slots__ = (
        # identity and the trace's ask
        "idx",
        "request_id",
        "session_id",
        "turn_index",
        "input_length",
        "output_length",
        "prompt_hashes",
        "planned_arrival_ms",
        "delay_ms",
        "affinity_group",  # the key sibling_group affinity binds by (None: no lineage)
        # the prompt's canonical trace ids and the trace block size (None: no hash ids); only
        # for Dynamo's sequence hashes, G2's tie-break (model/workload/dynamo_ids.py)
        "canonical_ids",
        "dynamo_hashes",  # its prompt's block keys -> Dynamo's sequence hashes, once needed
        # scheduler state
        "status",
        "worker_idx",
        "dp_rank",
        "num_computed_tokens",
        "num_output_tokens",
        "held_hashes",
        "held_private_blocks",
        "prefilling",
        "n_preemptions",
        "n_admissions",
        # KV tiers: prompt blocks already copied to G2 (and the copy in flight); an admission's
        # reuse by tier; the G1 blocks a finished G2/G3 load brought (cached blocks of its
        # coming admission)
        "host_cursor",
        "host_store",  # its latest store to G2 while in flight (the event of its landing)
        "host_refused",  # prompt blocks up to which a store G2 had no room for was counted
        "admit_host_tokens",
        "admit_disk_tokens",
        "loaded_blocks",
        # P/D: the prefill copy holds its KV after finishing; the decode request arrives with
        # its prompt's KV already in place (materialized)
        "hold_kv",
        "materialized",
        "accept_seq",
        "parent",
        "router_entered_ms",  # when the router put it aside (waiting for its key's binding)
        "reserved",
        # record
        "arrival_ms",
        "first_admit_ms",
        "first_token_ms",
        "second_token_ms",
        "last_token_ms",
        "terminal_ms",
        "token_times_ms",
        "reused_input_tokens",
        "host_reused_input_tokens",
        "disk_reused_input_tokens",
        "first_admission_reused_tokens",
        "prefill_worker_idx",
        "prefill_dp_rank",
        "prefill_admit_ms",
        "source_held_ms",
        "destination_reserved_ms",
        "destination_activated_ms",
        "decode_admit_ms",
        "source_released_ms",
        "decode_reused_input_tokens",
        "transfer_tokens",
        "n_prefill_admissions",  # P/D: its prefill copy's admissions (n_admissions: decode's)
        "terminal_status",
        "reason",
        "done",
    )

    def __init__(
        self,
        idx: int,
        request_id: str,
        input_length: int,
        output_length: int,
        prompt_hashes: list[int],
        planned_arrival_ms: float | None = None,
        session_id: str | None = None,
        turn_index: int = 0,
        delay_ms: float = 0.0,
    ) -> None:
        self.idx = idx
        self.request_id = request_id
        self.session_id = session_id
        self.turn_index = turn_index
        self.input_length = input_length
        self.output_length = output_length
        self.prompt_hashes = prompt_hashes
        self.planned_arrival_ms = planned_arrival_ms
        self.delay_ms = delay_ms
        self.affinity_group: str | None = None
        self.canonical_ids: tuple[list[int], int] | None = None
        self.dynamo_hashes: dict[int, int] | None = None
        self.router_entered_ms = 0.0

        self.status = Status.PENDING
        self.worker_idx = -1
        self.dp_rank = 0
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.held_hashes: list[Any] = []  # content hashes, or (hash, serial) for a duplicate copy
        self.held_private_blocks = 0
        self.prefilling = True
        self.n_preemptions = 0
        self.n_admissions = 0
        self.host_cursor = 0
        self.host_refused = 0
        self.host_store: simpy.Event | None = None
        self.admit_host_tokens = 0
        self.admit_disk_tokens = 0
        self.loaded_blocks = 0
        self.hold_kv = False
        self.materialized = False
        self.accept_seq = 0
        self.parent: Request | None = None
        self.reserved: simpy.Event | None = None

        self.arrival_ms = float("nan")
        self.first_admit_ms = float("nan")
        self.first_token_ms = float("nan")
        self.second_token_ms = float("nan")
        self.last_token_ms = float("nan")
        self.terminal_ms = float("nan")
        self.token_times_ms: array[float] | None = None
        self.reused_input_tokens = 0
        self.host_reused_input_tokens = 0
        self.disk_reused_input_tokens = 0
        self.first_admission_reused_tokens = 0
        self.prefill_worker_idx = -1
        self.prefill_dp_rank = -1
        nan = float("nan")
        self.prefill_admit_ms = nan
        self.source_held_ms = nan
        self.destination_reserved_ms = nan
        self.destination_activated_ms = nan
        self.decode_admit_ms = nan
        self.source_released_ms = nan
        self.decode_reused_input_tokens = 0
        self.transfer_tokens = 0
        self.n_prefill_admissions = 0
        self.terminal_status = ""
        self.reason = ""
        self.done: simpy.Event | None = None

    @property
    def seq_len(self) -> int:
        """Tokens whose values are known: the prompt plus every token emitted so far."""
        return self.input_length + self.num_output_tokens

    def prefill_copy(self) -> Request:
        """The request a prefill worker runs for this one: same prompt, at most one token (the
        first, which the decode side regenerates), KV held after it finishes."""
        copy = Request(
            self.idx,
            self.request_id,
            self.input_length,
            min(1, self.output_length),
            self.prompt_hashes,
            session_id=self.session_id,
            turn_index=self.turn_index,
        )
        copy.hold_kv = True
        copy.canonical_ids = self.canonical_ids
        copy.parent = self
        copy.arrival_ms = self.arrival_ms
        return copy

    def note_reuse(self, reused_tokens: int, host_tokens: int, disk_tokens: int) -> None:
        """An admission reused `reused_tokens` (of which `host_tokens` came from G2 and
        `disk_tokens` from G3): the record keeps the admission that reused the most."""
        if reused_tokens > self.reused_input_tokens:
            self.reused_input_tokens = reused_tokens
            self.host_reused_input_tokens = host_tokens
            self.disk_reused_input_tokens = disk_tokens

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, in={self.input_length}, out={self.output_length}, "
            f"computed={self.num_computed_tokens}, emitted={self.num_output_tokens})"
        )
