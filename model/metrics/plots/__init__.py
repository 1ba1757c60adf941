"""Plots of one run's tables: what each request saw, what each worker ran, how full the KV was.

`latency`:

* `latency_timeline`: each completed request's TTFT and E2E latency against its arrival time,
  with a rolling median, so load building up and draining shows as a drift of the median.
* `itl_distribution`: the distribution (CDF or histogram) of per-request TPOT and TTFT, and of
  the pooled inter-token gaps when the run kept token times (`output.per_token`).
* `latency_comparison`: TTFT, TPOT and (with token times) inter-token gap distributions of
  several runs side by side.

`passes`:

* `pass_timeline`: a Gantt chart of every worker's forward passes in a time window, one row per
  worker (and DP rank), labelled by pool (`p0`, `d0`, `w0`). Aggregated workers' passes are
  coloured prefill-only / decode-only / mixed (continuous batching: prefill chunks ride along
  with decode steps); a disaggregated cluster's passes are coloured by role (prefill worker,
  decode worker). Each bar is labelled with its number of decoding sequences, and each arrival
  is drawn as a marker with a line to its first token (its TTFT).

`swimlanes`:

* `request_swimlanes`: one lane per request, cut into the phases of its life: queue, prefill,
  (P/D only: wait for a decode reservation, transfer, decode queue), decode.

`kv`:

* `kv_occupancy`: used blocks (held by requests) and cached blocks (held by no request, kept for
  prefix reuse until evicted) of each KV pool over time, as a step plot, with each pool's
  capacity.

`agentic`, of an agentic replay (docs/agentic.md), which adds `play_id`, `lane` and `phase` to
the requests and a `plays` table (any other run raises ValueError):

* `lane_timeline`: one row per agent lane: each play's span from start to settle, its LLM calls
  (main agent and sub-agents apart), the tool waits between a session's calls, and a warm run's
  preparation requests and barrier.
* `context_growth`: each play's main-session input tokens by turn, and how many were reused.
* `reuse_per_turn`: per turn index, the mean fraction of input tokens reused from G1 (device)
  and from G2 (host), stacked.

Every function takes a `Result` (or the one table it reads), draws on the given Axes or on a new
figure, and returns the Axes (`latency_comparison`, which draws several, returns the Figure).
Times on the x axis are seconds for whole-run plots and milliseconds for the pass window and the
swimlanes. Every name is importable from here (`from servesim.metrics import plots;
plots.pass_timeline(...)`). matplotlib is imported inside the functions, so importing this
package stays light; the model itself never plots.
"""

from servesim.metrics.plots.agentic import (
    CALL_KINDS,
    MAIN_BAND,
    PLAY_LABEL_Y,
    PLAY_SPAN,
    PLAY_STATUS_COLOURS,
    SUB_BAND,
    SUBAGENT_MARK,
    TOOL_WAIT,
    context_growth,
    is_subagent,
    lane_timeline,
    main_sessions,
    reuse_per_turn,
)
from servesim.metrics.plots.kv import kv_occupancy, pool_capacities, pool_role
from servesim.metrics.plots.latency import (
    itl_distribution,
    latency_comparison,
    latency_timeline,
)
from servesim.metrics.plots.passes import (
    ARRIVAL_LEVELS,
    BAR_HEIGHT,
    BAR_OFFSET,
    PASS_KINDS,
    ROLE_KINDS,
    ROLE_ORDER,
    ROLE_PREFIX,
    lane_labels,
    pass_category,
    pass_kind,
    pass_timeline,
)
from servesim.metrics.plots.swimlanes import (
    SWIMLANE_SEGMENTS,
    request_swimlanes,
    swimlane_segments,
)

__all__ = [
    "ARRIVAL_LEVELS",
    "BAR_HEIGHT",
    "BAR_OFFSET",
    "CALL_KINDS",
    "MAIN_BAND",
    "PASS_KINDS",
    "PLAY_LABEL_Y",
    "PLAY_SPAN",
    "PLAY_STATUS_COLOURS",
    "ROLE_KINDS",
    "ROLE_ORDER",
    "ROLE_PREFIX",
    "SUBAGENT_MARK",
    "SUB_BAND",
    "SWIMLANE_SEGMENTS",
    "TOOL_WAIT",
    "context_growth",
    "is_subagent",
    "itl_distribution",
    "kv_occupancy",
    "lane_labels",
    "lane_timeline",
    "latency_comparison",
    "latency_timeline",
    "main_sessions",
    "pass_category",
    "pass_kind",
    "pass_timeline",
    "pool_capacities",
    "pool_role",
    "request_swimlanes",
    "reuse_per_turn",
    "swimlane_segments",
]
