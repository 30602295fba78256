"""Was a run's load open-loop? Session-start lateness against the test's registered bound.

The experiment's claim rests on open-loop arrivals: sessions start at the plan's times whatever the
server does. A wall-clock client that shares its CPU with the engine (a CPU cell at ~14 sessions/s
on two cores) falls behind its own timers, and a run whose session starts were late by a large
fraction of an inter-arrival gap has quietly become partly closed-loop. So every run records each
session's start lateness (the sessions table's `start_lateness`: when the client played the arrival
minus its planned time), and this module summarises it (p50, p99, max) and compares the 99th
percentile with the bound the test registered (`TestConfig.start_lateness_p99`, recorded in the
run's meta.json).

What is judged is the base stream: its Poisson timing is the open-loop load at rate lambda that the
rule's conditions compare with lambda_miss. The burst is an initial condition, hundreds of sessions
in a few seconds (a fast cell's scaled burst starts hundreds per second), so a loaded client starts
it late by design of the load, not by a fault of the run; its lateness is recorded beside, unjudged.

The runner uses the same summary for meta.json and its warning; the verdict recomputes it from the
raw sessions table and lists the runs above the bound. It never changes a run's state: whether such
a run may count is the registration's business, seeing it is ours.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def lateness_summary(values: Iterable[float], bound: float | None) -> dict[str, Any]:
    """n, p50, p99 and max of start lateness (seconds), and whether p99 is within `bound`.

    `within_bound` is None when there is nothing to judge (no arrival played, or no bound)."""
    import numpy as np  # here, not at the top: the verdict layout (analysis.paired) and `status` need no numpy

    arr = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    n = int(arr.size)
    p50 = float(np.quantile(arr, 0.5)) if n else None
    p99 = float(np.quantile(arr, 0.99)) if n else None
    mx = float(arr.max()) if n else None
    within = None if (bound is None or p99 is None) else bool(p99 <= bound)
    return {"n": n, "p50_s": p50, "p99_s": p99, "max_s": mx, "bound_p99_s": bound, "within_bound": within}


def open_loop_summary(base: Iterable[float], burst: Iterable[float], bound: float | None) -> dict[str, Any]:
    """The run's record: the base stream's summary, judged against `bound`, and the burst's beside."""
    b = lateness_summary(burst, None)
    b.pop("bound_p99_s")
    b.pop("within_bound")
    return {**lateness_summary(base, bound), "judged": "base", "burst": b}


def warning_text(summary: Mapping[str, Any]) -> str | None:
    """The warning a run carries when its p99 start lateness exceeds the bound, else None."""
    if summary.get("within_bound") is not False:
        return None
    return (
        f"base-stream session starts ran late: p99 {1e3 * summary['p99_s']:.0f} ms (p50 {1e3 * summary['p50_s']:.0f} "
        f"ms, max {1e3 * summary['max_s']:.0f} ms over {summary['n']} arrivals) exceeds the test's bound "
        f"start_lateness_p99 = {1e3 * summary['bound_p99_s']:.0f} ms: the load was not open-loop within it"
    )


def run_open_loop(meta: Mapping[str, Any], sessions: pd.DataFrame) -> dict[str, Any] | None:
    """A run's summary recomputed from its sessions table, with the bound its meta.json recorded.

    None for a record without start lateness (written before it was recorded)."""
    if "start_lateness" not in sessions.columns:
        return None
    bound = (meta.get("open_loop") or {}).get("bound_p99_s")
    vals = sessions["start_lateness"].to_numpy(dtype=float, na_value=math.nan)
    kind = sessions["kind"].to_numpy()
    return open_loop_summary(
        vals[kind == "base"].tolist(), vals[kind == "burst"].tolist(), None if bound is None else float(bound)
    )


def verdict_block(entries: Sequence[tuple[str, str, float, int, dict[str, Any] | None]]) -> dict[str, Any]:
    """The verdict's `open_loop` entry from (run, arm, rate, seed, summary) per run, in a fixed
    order (arm, rate, seed, run): the verdict of the same runs does not depend on the order they
    were given in (a test run lists them as they finished, `analyze` as it finds them)."""
    runs = [
        {"run": name, "arm": arm, "rate": rate, "seed": seed, **s}
        for name, arm, rate, seed, s in sorted(
            entries, key=lambda e: (str(e[1]), e[2] if e[2] == e[2] else math.inf, int(e[3]), str(e[0]))
        )
        if s is not None
    ]
    return {"runs": runs, "not_within": [r["run"] for r in runs if r["within_bound"] is False]}


def report_lines(block: Mapping[str, Any] | None) -> list[str]:
    """Markdown lines naming the runs whose load was not open-loop within the bound (none: no lines)."""
    bad = [r for r in (block or {}).get("runs", []) if r.get("within_bound") is False]
    if not bad:
        return []
    lines = [
        "",
        "Runs whose load was not open-loop within the registered bound (p99 start lateness of the base stream):",
    ]
    for r in bad:
        lines.append(
            f"- {r['arm'].upper()} {r['rate']:g} seed {r['seed']}: p99 {1e3 * r['p99_s']:.0f} ms > "
            f"{1e3 * r['bound_p99_s']:.0f} ms (p50 {1e3 * r['p50_s']:.0f} ms, max {1e3 * r['max_s']:.0f} ms)"
        )
    return lines
