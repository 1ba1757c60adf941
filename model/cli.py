"""The `servesim` command: Hydra composes conf/, the model validates and runs it.

    servesim                                    # the shipped default, prints its summary
    servesim experiment=dynamo_compat workload=mooncake workload.path=TRACE \\
        topology.num_workers=4 hydra.run.dir=OUT
    servesim --multirun topology.num_workers=1,2,4

This is the only module that imports Hydra. Its exit status is a contract (docs/running.md):

    0    the run completed (a multirun: every job did)
    1    an unexpected error (a bug: the traceback is printed)
    2    bad input: a config key, value or option, or a trace file; one message naming the
         config path or the file and line
    3    the run ended without completing a single request (its summary is written; why is
         said on stderr)
    130  interrupted by SIGINT (Ctrl-C), 143 by SIGTERM: no summary.json is written

A run directory follows model/rundir.py: a run that fails or is interrupted leaves `error.json`
and no `summary.json` (one that completes no request leaves both, and exits 3). In a multirun a
failing job records its error and the sweep goes on; the multirun then exits with the status of
its first failed job.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import (
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from servesim import rundir
from servesim.config.compose import composition_message, to_data
from servesim.config.load import ConfigError, validate_config
from servesim.sim import Result, simulate
from servesim.speed import native
from servesim.timing import geometry_ignored
from servesim.workload.errors import TraceError

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_NO_REQUEST_COMPLETED = 3
SIGNAL_EXIT_BASE = 128  # interrupted by signal N: 128 + N (130 SIGINT, 143 SIGTERM)

ROWS = (
    ("TTFT", "ttft"),
    ("TTST", "ttst"),
    ("TPOT", "tpot"),
    ("ITL", "itl"),
    ("E2E", "e2e_latency"),
)


def _fmt(x: Any) -> str:
    return "-" if x is None else f"{x:,.2f}"


def format_summary(summary: dict[str, Any]) -> str:
    """A short table of the run's latency distributions, throughput and counts."""
    lines = [f"{'metric (ms)':<12}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}{'max':>12}"]
    for label, key in ROWS:
        lines.append(
            f"{label:<12}"
            + "".join(
                f"{_fmt(summary.get(f'{s}_{key}_ms')):>12}"
                for s in ("mean", "median", "p90", "p99", "max")
            )
        )
    counts = summary.get("terminal_status_counts", {})
    not_arrived = summary.get("not_arrived_requests", 0)
    wall_ms = summary.get("metadata", {}).get("wall", {}).get("wall_time_ms")
    lines += [
        "",
        f"requests     {sum(counts.values()):,}: "
        + ", ".join(f"{v:,} {k}" for k, v in counts.items())
        + (f" ({not_arrived:,} of them never arrived)" if not_arrived else ""),
        f"duration     {summary['duration_ms'] / 1000:,.1f} s simulated"
        + (f" in {wall_ms / 1000:,.2f} s wall" if wall_ms is not None else ""),
        f"throughput   {summary['request_throughput_rps']:,.3f} req/s, "
        f"{summary['output_throughput_tok_s']:,.1f} output tok/s, "
        f"{summary['total_throughput_tok_s']:,.1f} total tok/s",
        f"prefix reuse {summary['prefix_cache_reused_ratio']:.4f} of input tokens",
    ]
    if "total_trajectories" in summary:  # an agentic replay
        lines.append(
            f"plays        {summary['total_trajectories']:,}: "
            + ", ".join(
                f"{summary[f'{k}_trajectories']:,} {k}" for k in ("completed", "incomplete")
            )
            + f" ({summary['failed_trajectories']:,} of them failed)"
        )
    return "\n".join(lines)


def simulate_and_write(cfg: DictConfig, out_dir: str | Path) -> Result:
    """Validate a composed config, simulate it, write the run directory. A timing model that
    ignores the model, GPU and TP the config sets is said on stderr first (one line)."""
    run_cfg = validate_config(to_data(cfg))
    note = geometry_ignored(run_cfg)
    if note is not None:
        print(f"servesim: note: {note}", file=sys.stderr)
    result = simulate(run_cfg)
    result.write(out_dir)
    return result


def run(cfg: DictConfig, out_dir: str | Path) -> dict[str, Any]:
    """Validate a composed config, simulate it, write the run directory; returns the summary."""
    return simulate_and_write(cfg, out_dir).summary


def no_completion(result: Result) -> str:
    """Why a run completed no request: its counts by status and the first request's reason."""
    summary = result.summary
    counts = summary.get("terminal_status_counts", {})
    told = ", ".join(f"{v:,} {k}" for k, v in counts.items()) or "no request arrived"
    reqs = result.requests
    ended = reqs[reqs["reason"].fillna("") != ""] if "reason" in reqs else reqs.iloc[:0]
    why = ""
    if len(ended):
        first = ended.iloc[0]
        why = f"; e.g. {first['request_id']} {first['terminal_status']}: {first['reason']}"
    return f"no request completed ({told}{why})"


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived: the run stops where it is (a KeyboardInterrupt, so that
    nothing that catches Exception swallows it). Its one argument is the signal number: SimPy
    re-raises a process's exception as `type(e)(*e.args)`."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = int(signum)
        self.reported = False

    def __str__(self) -> str:
        return signal.Signals(self.signum).name


def _signum(e: KeyboardInterrupt) -> int:
    return e.signum if isinstance(e, Interrupted) else signal.SIGINT


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise Interrupted in this process while the block runs (a process
    forked meanwhile, e.g. a partitioned replay's, dies of them as by default)."""
    pid = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != pid:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Interrupted(signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_job(cfg: DictConfig, out_dir: Path, multirun: bool) -> int:
    """One run into `out_dir`: its exit status. A failure is recorded in `error.json` and
    said on stderr; an interrupt too, and then raised on (it stops a sweep as well)."""
    rundir.clear(out_dir)
    try:
        result = simulate_and_write(cfg, out_dir)
    except (ConfigError, TraceError) as e:
        return _failed(out_dir, EXIT_BAD_INPUT, str(e))
    except KeyboardInterrupt as e:
        signum = _signum(e)
        name = signal.Signals(signum).name
        with contextlib.suppress(OSError):
            rundir.write_error(
                out_dir, "interrupted", SIGNAL_EXIT_BASE + signum, f"interrupted by {name}"
            )
        print(
            f"servesim: interrupted by {name}: {out_dir} is incomplete (no summary.json)",
            file=sys.stderr,
        )
        if isinstance(e, Interrupted):
            e.reported = True
        raise
    except Exception as e:
        status = _failed(out_dir, EXIT_ERROR, f"{type(e).__name__}: {e}")
        if not multirun:
            raise
        traceback.print_exc()
        return status
    print(format_summary(result.summary))
    print(f"outputs      {out_dir}")
    # which code ran: the source, or its compiled build (`servesim-native build`)
    print(f"code         {'native build ' + native.ACTIVE if native.ACTIVE else 'Python source'}")
    if result.summary["completed_requests"] == 0:
        return _failed(out_dir, EXIT_NO_REQUEST_COMPLETED, no_completion(result))
    return EXIT_OK


def _failed(out_dir: Path, status: int, message: str) -> int:
    print(f"servesim: {message}", file=sys.stderr)
    with contextlib.suppress(OSError):
        rundir.write_error(out_dir, rundir.FAILED, status, message)
    return status


@hydra.main(version_base="1.3", config_path="pkg://servesim.conf", config_name="config")
def _hydra_main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    status = run_job(cfg, Path(hydra_cfg.runtime.output_dir), multirun)
    if status != EXIT_OK and not multirun:
        sys.exit(status)


class SweepStatus(Callback):
    """Hydra callback (conf/config.yaml `hydra.callbacks`): at the end of a multirun, with
    any launcher, reads the status of each job it ran from the job's directory and exits
    with the first failed job's status if one failed (1 if one only left no summary)."""

    def __init__(self) -> None:
        self.started = time.time()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        # file times are taken from a coarser clock: a second's slack
        self.started = time.time() - 1.0

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        jobs = sweep_jobs(Path(str(config.hydra.sweep.dir)), self.started)
        bad = [(job, rundir.run_status(job)) for job in jobs]
        bad = [(job, s) for job, s in bad if s[0] != rundir.COMPLETED]
        if not bad:
            return
        print(f"servesim: {len(bad)} of {len(jobs)} jobs did not complete:", file=sys.stderr)
        for job, (status, code, message) in bad:
            said = " ".join(message.split()) or "no summary.json, no error.json"
            exit_status = f" (exit status {code})" if code is not None else ""
            print(f"  {job}: {status}{exit_status}: {said}", file=sys.stderr)
        codes = [s[1] for _, s in bad if s[0] == rundir.FAILED and s[1]]
        sys.exit(codes[0] if codes else EXIT_ERROR)


def sweep_jobs(sweep_dir: Path, since: float) -> list[Path]:
    """The job directories under `sweep_dir` that a multirun started at `since` (epoch
    seconds) ran: those whose `.hydra/overrides.yaml` it wrote, in job order."""
    jobs = [
        p.parent.parent
        for p in sweep_dir.rglob(".hydra/overrides.yaml")
        if p.stat().st_mtime >= since
    ]
    return sorted(jobs, key=_job_order)


def _job_order(job: Path) -> tuple[int, str]:
    return (int(job.name), "") if job.name.isdigit() else (sys.maxsize, str(job))


@contextlib.contextmanager
def _hydra_errors_raised() -> Iterator[None]:
    """Hydra prints its own errors and exits 1 unless HYDRA_FULL_ERROR is set: with it set,
    they reach main(), which says them as servesim's and exits 2."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def main() -> None:
    """The console script: Hydra's entry, with its errors, interrupts and exit status made
    servesim's (see the module docstring)."""
    try:
        with signals_interrupt(), _hydra_errors_raised():
            _hydra_main()
    except KeyboardInterrupt as e:
        signum = _signum(e)
        if not (isinstance(e, Interrupted) and e.reported):
            print(f"servesim: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        sys.exit(SIGNAL_EXIT_BASE + signum)
    except (ConfigCompositionException, OverrideParseException, MissingConfigException) as e:
        print(f"servesim: {composition_message(e)}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)
    except (ConfigError, TraceError) as e:  # a composition error in a joblib worker's job
        print(f"servesim: {e}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


if __name__ == "__main__":
    main()
