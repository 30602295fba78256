"""The CPU quota a real run's engine ran under, and what it does to that run's costs.

Why: a CPU engine under a CFS quota of q CPUs computes q CPU-seconds per second, so every step and
every request costs it 1/q of the CPU time they take. The speed pin chooses q per server start, so
the runs of one test ran at different quotas (0.50-0.76 CPU for the registered CPU test) and were
not equally fast: replayed with one cost, the runs whose pin chose more CPU drained their gate
faster than the replay (docs/sim2real.md). A cost fitted with `calibrate costs --quota-scaled`
records the quota it holds at (`cpu_quota`, the mean of its timing runs' quotas, to which each
run's timings are scaled), and a replay of a run recorded at quota q plays it at speed q / cpu_quota.

The quota is read from the run's record, never assumed: the speed pin's final quota when the pin
set one (meta.json `engine_speed_pin.quota`), else the `--cores` of a launch through
harness.servers.cpuquota (meta.json `engine_launch.argv`). A run with neither ran unquota'd.
"""

from __future__ import annotations

from typing import Any

CPUQUOTA_MODULE = "harness.servers.cpuquota"


def run_quota(meta: dict[str, Any]) -> float | None:
    """The CPU quota (cores) the run's engine ran under, from its meta.json; None when it had none."""
    pin = meta.get("engine_speed_pin") or {}
    if isinstance(pin, dict) and pin.get("applied") and isinstance(pin.get("quota"), int | float):
        return float(pin["quota"])
    argv = (meta.get("engine_launch") or {}).get("argv") or []
    if CPUQUOTA_MODULE in argv and "--cores" in argv:
        i = argv.index("--cores")
        if i + 1 < len(argv):
            try:
                return float(argv[i + 1])
            except ValueError:
                return None
    return None


def quota_scales(quotas: list[float | None], names: list[str]) -> tuple[float, list[float]]:
    """The reference quota (the mean of the runs') and, per run, the factor that takes its observed
    durations to that quota (q_run / q_ref: a run at more CPU took less time than it would at the
    reference). Raises ValueError naming a run without a recorded quota."""
    missing = [n for n, q in zip(names, quotas, strict=True) if q is None]
    if missing:
        raise ValueError(
            f"--quota-scaled: no CPU quota recorded in {', '.join(missing)} (meta.json engine_speed_pin.quota or a "
            "launch through harness.servers.cpuquota); fit without --quota-scaled, or leave those runs out"
        )
    qs = [float(q) for q in quotas if q is not None]
    ref = sum(qs) / len(qs)
    return ref, [q / ref for q in qs]


def replay_speed_factor(meta: dict[str, Any], cost_quota: float | None, run_name: str) -> dict[str, Any] | None:
    """How a quota-scaled cost's speed moves for this run (None: the cost is not quota-scaled).

    Returns {"run_quota", "cost_quota", "factor"}; a quota-scaled cost offered for a run without a
    recorded quota is refused (ValueError), since nothing says how fast that run's engine was."""
    if cost_quota is None:
        return None
    q = run_quota(meta)
    if q is None:
        raise ValueError(
            f"{run_name}: the cost holds at a CPU quota of {cost_quota:g} (cpu_quota) but the run records no quota "
            "(meta.json engine_speed_pin.quota or a cpuquota launch); replay it with a cost fitted without "
            "--quota-scaled"
        )
    return {"run_quota": q, "cost_quota": float(cost_quota), "factor": q / float(cost_quota)}
