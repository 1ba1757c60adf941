"""The per-request record: one row per request, its fields defined once.

`REQUEST_RECORD` lists the `requests` table's columns in table order, each with its type, unit,
one-line meaning (the column table of docs/metrics.md, checked by tests/unit/test_records.py)
and its name in `requests.jsonl` (the mocker's per-request field name) where it is exported.
The recorder's storage (`REQUEST_FIELDS`), the table's dtypes (`REQUEST_DTYPES`) and the JSONL
records (`jsonl_records`) are derived from it; `request_row` builds the row in the same order
(but for the engine: one value a run, filled in by the table).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from servesim.workload.request import Request

COMPLETED = "completed"
REJECTED = "rejected"
INCOMPLETE = "incomplete"
NAN = float("nan")

# each type as docs/metrics.md writes it -> (pandas dtype of the column, storage in Columns:
# "d" float, "q" int, "o" object); a float column that only ever received ints comes out
# int64 (see Columns), a "str or null" column of nulls only comes out object
TYPES = {
    "str": ("str", "o"),
    "str or null": ("str", "o"),
    "int": ("int64", "q"),
    "nullable int": ("Int64", "q"),
    "float": ("float64", "d"),
}


@dataclass(frozen=True)
class Field:
    """One column of the `requests` table."""

    name: str
    type: str  # a key of TYPES
    unit: str  # "ms", "tokens", or "" for none
    meaning: str  # one line: the meaning column of docs/metrics.md
    jsonl: str | None = None  # its name in requests.jsonl; None: in the table only
    coded: bool = False  # a few distinct values: stored as a code per row
    # nullable int: recorded raw, NA in the table where this column is negative (-1: none)
    null_where: str | None = None
    recorded: bool = True  # False: one value a run (the engine), filled in by the table

    @property
    def dtype(self) -> str:
        """The column's pandas dtype."""
        return TYPES[self.type][0]

    @property
    def storage(self) -> str:
        """How `Columns` keeps it: "d" float, "q" int, "o" object, "c" coded."""
        return "c" if self.coded else TYPES[self.type][1]


# the table's columns in order (P/D ones from prefill_dp_rank on: NaN, null or 0 when
# aggregated)
REQUEST_RECORD: tuple[Field, ...] = (
    Field(
        "request_id",
        "str",
        "",
        (
            "the trace's `request_id`, else its line number (Mooncake, Azure); synthetic "
            "`s{session}t{turn}`"
        ),
        jsonl="request_id",
    ),
    Field(
        "session_id",
        "str or null",
        "",
        "the trace's `session_id` (synthetic: `s{i}` when `turns_per_session > 1`)",
        jsonl="session_id",
    ),
    Field(
        "turn_index", "int", "", "0 for a first turn, k for the k-th later turn", jsonl="turn_index"
    ),
    Field(
        "arrival_ms",
        "float",
        "ms",
        (
            "when it was dispatched to a worker (P/D: to a prefill worker; open loop: its planned"
            " time; closed loop: when its slot took it). NaN if it never arrived"
        ),
        jsonl="arrival_time_ms",
    ),
    Field(
        "first_admit_ms",
        "float",
        "ms",
        (
            "start of the pass that first admitted it (moved it from waiting to running; P/D: on "
            "its prefill worker, = `prefill_admit_ms`). With KV tiers, a request whose prefix is "
            "loaded from G2 or G3 is admitted at the first pass after the copy lands, so the "
            "copy's time is before this. NaN if never admitted"
        ),
        jsonl="first_admit_ms",
    ),
    Field(
        "first_token_ms",
        "float",
        "ms",
        (
            "end of the pass that emitted its first token (P/D: its first decode pass). NaN if it"
            " emitted none"
        ),
        jsonl="first_token_ms",
    ),
    Field(
        "last_token_ms",
        "float",
        "ms",
        "end of the pass that emitted its latest token. NaN if none",
        jsonl="last_token_ms",
    ),
    Field(
        "terminal_ms",
        "float",
        "ms",
        (
            "when it ended: the pass end at which it completed or was rejected; the stop time for"
            " `incomplete`"
        ),
        jsonl="terminal_time_ms",
    ),
    Field(
        "ttft_ms",
        "float",
        "ms",
        "`first_token_ms - arrival_ms`; NaN without a token",
        jsonl="ttft_ms",
    ),
    Field(
        "ttst_ms",
        "float",
        "ms",
        "second token time - `first_token_ms`; NaN with fewer than 2 tokens",
        jsonl="ttst_ms",
    ),
    Field(
        "tpot_ms",
        "float",
        "ms",
        (
            "this request's TPOT (time per output token after the first): `(last_token_ms - "
            "first_token_ms) / (output_length - 1)`; NaN with fewer than 2 tokens"
        ),
        jsonl="itl_ms",
    ),
    Field(
        "e2e_latency_ms",
        "float",
        "ms",
        "`last_token_ms - arrival_ms`; NaN without a token",
        jsonl="e2e_latency_ms",
    ),
    Field("input_length", "int", "tokens", "prompt length", jsonl="input_length"),
    Field(
        "requested_output_length",
        "int",
        "tokens",
        "output length the trace asked for",
        jsonl="requested_output_length",
    ),
    Field(
        "output_length",
        "int",
        "tokens",
        (
            "tokens actually emitted (less than requested when cut by `max_model_len`, rejected "
            "after preemption, or incomplete)"
        ),
        jsonl="output_length",
    ),
    Field(
        "reused_input_tokens",
        "int",
        "tokens",
        (
            "prefix-cache hit: the largest over its admissions (a multiple of `block_size`; P/D: "
            "its admissions on the prefill worker). With KV tiers the hit includes the blocks "
            "loaded from G2 and G3"
        ),
        jsonl="reused_input_tokens",
    ),
    Field(
        "g1_reused_input_tokens",
        "int",
        "tokens",
        (
            "the part of `reused_input_tokens` found in G1 (the rank's GPU pool), in the "
            "admission that reused the most (the first such admission on a tie)"
        ),
    ),
    Field(
        "host_reused_input_tokens",
        "int",
        "tokens",
        "the part loaded from G2 (host) in that admission; 0 without KV tiers",
    ),
    Field(
        "disk_reused_input_tokens",
        "int",
        "tokens",
        (
            "the part restored from G3 (disk) in that admission; 0 without G3. `g1_ + host_ + "
            "disk_reused_input_tokens = reused_input_tokens`"
        ),
    ),
    Field(
        "first_admission_reused_input_tokens",
        "int",
        "tokens",
        (
            "prefix-cache hit at its first admission (P/D: on the prefill worker), tier-loaded "
            "blocks included"
        ),
    ),
    Field(
        "prefill_worker_idx",
        "nullable int",
        "",
        (
            "P/D: its prefill worker, 0 to `num_prefill_workers - 1`, chosen when it arrived. "
            "Null in an aggregated run: an aggregated worker is not a separate prefill worker (as"
            " in the mocker's records)"
        ),
        jsonl="prefill_worker_idx",
        null_where="prefill_worker_idx",
    ),
    Field(
        "decode_worker_idx",
        "nullable int",
        "",
        (
            "aggregated: the worker that served it (prefill and decode); P/D: its decode worker, "
            "0 to `num_decode_workers - 1`, chosen when its prefill finished. Null if it never "
            "got one (never dispatched; P/D: rejected on the prefill side or by the decode check,"
            " or cut off before its prefill finished)"
        ),
        jsonl="decode_worker_idx",
        null_where="decode_worker_idx",
    ),
    Field(
        "dp_rank",
        "int",
        "",
        (
            "attention-DP rank, on the worker in `decode_worker_idx`, that served it (P/D: its "
            "decode rank); 0 with `dp_size` 1, and 0 (not null) when it has no such worker"
        ),
    ),
    Field(
        "engine",
        "str",
        "",
        (
            "the engine that served it, `engine.kind`: `vllm`, `sglang`, `trtllm` or a "
            "plug-in's name; the same in every row of a run (P/D: both pools run `engine.kind`, "
            "as `topology.prefill` and `topology.decode` override an engine's settings, not its"
            " kind)"
        ),
        recorded=False,
    ),
    Field(
        "n_preemptions",
        "int",
        "",
        (
            "times it was preempted (recompute; with `engine=sglang`, retracted). P/D: on either "
            "side (its prefill copy's preemptions count here too)"
        ),
    ),
    Field(
        "n_admissions",
        "int",
        "",
        (
            "times a scheduler admitted it (moved it from waiting to running); 0 if never. P/D: "
            "its prefill copy's admissions plus its decode worker's, where taking in its "
            "delivered KV is one, so 2 without preemption (the mocker's `admission_count`, but "
            "for a request of no output: the decode worker settles it without an admission)"
        ),
    ),
    Field(
        "n_readmissions",
        "int",
        "",
        (
            "admissions after a preemption or retraction: on each side (P/D: prefill, decode) "
            "its admissions after the first. A completed request has `n_readmissions = "
            "n_preemptions`; one cut off or rejected after a preemption may have fewer"
        ),
    ),
    Field(
        "terminal_status",
        "str",
        "",
        "`completed`, `rejected` or `incomplete`",
        jsonl="terminal_status",
        coded=True,
    ),
    Field(
        "reason",
        "str",
        "",
        "why it was rejected or is incomplete; empty when completed",
        coded=True,
    ),
    Field(
        "prefill_dp_rank",
        "nullable int",
        "",
        "P/D: its rank on the prefill worker; null in an aggregated run",
        null_where="prefill_worker_idx",
    ),
    Field(
        "prefill_admit_ms",
        "float",
        "ms",
        "P/D: start of the pass that first admitted it on its prefill worker",
        jsonl="prefill_admit_ms",
    ),
    Field(
        "source_held_ms",
        "float",
        "ms",
        (
            "P/D: end of the prefill pass that finished its prompt; from then on its KV is held "
            "on the prefill worker (the source)"
        ),
        jsonl="source_held_ms",
    ),
    Field(
        "destination_reserved_ms",
        "float",
        "ms",
        (
            "P/D: when its decode rank reserved KV blocks for the whole prompt (pinning the "
            "prefix it already held); its transfer starts then"
        ),
        jsonl="destination_reserved_ms",
    ),
    Field(
        "destination_activated_ms",
        "float",
        "ms",
        (
            "P/D: when the decode worker took the delivered KV: the transfer's end, or the end of"
            " the decode pass then running"
        ),
        jsonl="destination_activated_ms",
    ),
    Field(
        "decode_admit_ms",
        "float",
        "ms",
        (
            "P/D: start of the decode pass that first admitted it (its first decode pass; "
            "`first_token_ms` is that pass's end)"
        ),
        jsonl="decode_admit_ms",
    ),
    Field(
        "source_released_ms",
        "float",
        "ms",
        (
            "P/D: when the prefill worker let go of its KV: at the activation, or at the end of "
            "the prefill pass then running. Can be later than `terminal_ms`; NaN if it was "
            "rejected by the decode check"
        ),
        jsonl="source_released_ms",
    ),
    Field(
        "decode_reused_input_tokens",
        "int",
        "tokens",
        (
            "P/D: the largest prefix-cache hit over its admissions on the decode worker. "
            "Delivered KV is not a hit, so it is 0 unless it was preempted there and readmitted "
            "onto blocks still cached (or, with KV tiers, loaded from the decode rank's G2 or G3;"
            " this column is not split by tier); 0 in an aggregated run"
        ),
        jsonl="decode_reused_input_tokens",
    ),
    Field(
        "transfer_tokens",
        "int",
        "tokens",
        (
            "P/D: tokens its KV transfer moved: `input_length` with "
            "`link.timing_mode=full_prompt`, the whole blocks the decode rank lacked with "
            "`destination_missing` ([config.md](config.md#link--kv-transfers-between-pd-pools)); "
            "0 in an aggregated run or before a reservation"
        ),
    ),
)

# what the recorder stores per row (the engine is not: see Field.recorded)
REQUEST_COLUMNS = {f.name: f.storage for f in REQUEST_RECORD if f.recorded}
# the rows as recorded: the request's trace index first (the table's sort key, not a column)
REQUEST_FIELDS = {"_idx": "q", **REQUEST_COLUMNS}
# nullable int columns (pandas Int64): stored as the request's raw value and NA in the table
# where the named column is negative (a rank without a worker is NA too, whatever its value)
NULL_WHERE_NEGATIVE = {f.name: f.null_where for f in REQUEST_RECORD if f.null_where is not None}
# what the table casts: the number columns (a time stamped as int 0 is a float, as natively)
REQUEST_DTYPES = {f.name: f.dtype for f in REQUEST_RECORD if not f.type.startswith("str")}
# the JSONL's worker ids are the mocker's scheduler ids: worker x dp_size + this rank column
SCHEDULER_RANK = {"prefill_worker_idx": "prefill_dp_rank", "decode_worker_idx": "dp_rank"}


def request_row(req: Request, status: str, now_ms: float, reason: str) -> tuple:
    """The row `req` ends with (at `now_ms`, in `status`): its trace index, then a value per
    field of REQUEST_RECORD, in order. The nullable ints go in raw (-1: none)."""
    n = req.num_output_tokens
    first = req.first_token_ms
    # admissions per side (aggregated: one side; P/D: the prefill copy's, then the decode's)
    decode_admissions = req.n_admissions
    prefill_admissions = req.n_prefill_admissions
    host = req.host_reused_input_tokens
    disk = req.disk_reused_input_tokens
    return (
        req.idx,
        req.request_id,
        req.session_id,
        req.turn_index,
        req.arrival_ms,
        req.first_admit_ms,
        first,
        req.last_token_ms,
        now_ms,  # terminal_ms
        first - req.arrival_ms if n else NAN,  # ttft_ms
        req.second_token_ms - first if n >= 2 else NAN,  # ttst_ms
        (req.last_token_ms - first) / (n - 1) if n >= 2 else NAN,  # tpot_ms
        req.last_token_ms - req.arrival_ms if n else NAN,  # e2e_latency_ms
        req.input_length,
        req.output_length,  # requested_output_length
        n,  # output_length
        req.reused_input_tokens,
        req.reused_input_tokens - host - disk,  # g1_reused_input_tokens
        host,
        disk,
        req.first_admission_reused_tokens,
        req.prefill_worker_idx,
        req.worker_idx,  # decode_worker_idx
        req.dp_rank,
        req.n_preemptions,
        prefill_admissions + decode_admissions,  # n_admissions
        max(prefill_admissions - 1, 0) + max(decode_admissions - 1, 0),  # n_readmissions
        status,
        reason,
        req.prefill_dp_rank,
        req.prefill_admit_ms,
        req.source_held_ms,
        req.destination_reserved_ms,
        req.destination_activated_ms,
        req.decode_admit_ms,
        req.source_released_ms,
        req.decode_reused_input_tokens,
        req.transfer_tokens,
    )


def _absent(v: Any) -> bool:
    return v is None or v is pd.NA


def jsonl_records(
    requests: pd.DataFrame, prefill_dp: int = 1, decode_dp: int = 1
) -> Iterator[dict[str, Any]]:
    """The `requests.jsonl` record of every ended (not incomplete) request, ordered by arrival
    then request id: the fields of REQUEST_RECORD that have a JSONL name, in table order,
    under that name. Worker indices become the mocker's scheduler ids (worker x dp_size +
    rank, `prefill_dp` and `decode_dp` the pools' dp_size), and `decode_reused_input_tokens`
    is None unless the request had both a prefill and a decode worker (as the mocker writes
    it). Values are the table's (NaN and NA included)."""
    ended = requests[requests["terminal_status"] != INCOMPLETE]
    ended = ended.sort_values(["arrival_ms", "request_id"], kind="stable")
    dp_size = {"prefill_worker_idx": prefill_dp, "decode_worker_idx": decode_dp}
    key = {f.name: f.jsonl for f in REQUEST_RECORD if f.jsonl is not None}
    for row in ended.itertuples(index=False):
        r = row._asdict()
        rec = {k: r[name] for name, k in key.items()}
        for name, rank in SCHEDULER_RANK.items():
            worker = r[name]
            rec[key[name]] = None if _absent(worker) else int(worker) * dp_size[name] + int(r[rank])
        if _absent(r["prefill_worker_idx"]) or _absent(r["decode_worker_idx"]):
            rec[key["decode_reused_input_tokens"]] = None
        yield rec
