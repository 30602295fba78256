"""A registered test's time scale on the host that runs it: how much faster (or slower) this
host's engine is than the engine the registration was calibrated on, measured here, now.

Why. A scaled CPU cell's registered references (E0a's λ_ref and all-miss token rate) are the
calibrating host's; a CPU quota fixes the engine's share of a core, not what the core does, and two
machines of one kind have given the same cell under the same quota all-miss token rates 5-7x apart.
Played in wall time on a faster host, the registered plans reach an engine that keeps up with
them, and the registered rule (token rate within 15% of the all-miss rate, backlog slope against
λ - λ_miss) no longer describes that engine. The registered protocol is a plan in *plan time*
(harness/drivers/wall.py): played at `time_scale` s, every arrival, tool call and window comes s
times sooner in wall seconds, and every rate the records give is per plan second. An engine s
times faster, played at s, is the calibrated engine in plan time: the registered plans, rule and
references all hold unchanged (same plan hashes), and the run records the s it was played at.

What s is. The all-miss token rate is the one reference that is a property of the engine alone
(at saturation it does not depend on how far sessions have got): s = the uncached tokens/s of
the cell's engine with its prefix cache off, in a closed run large enough to saturate it here,
over the registration's all-miss token rate. The population is a multiple of the registered E0a
population (a faster host needs more sessions queued to stay saturated within the same
warm-up): `population_factor`, default 4. The closed run is E0a's client and statistics
(runs/closed_runs.py), in wall time (s is not known yet).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from analysis.calibration_summaries import E0a, load_summary
from harness.errors import ConfigError
from runs.closed_runs import cache_off, run_closed

POPULATION_FACTOR = 4  # x the registered E0a population: saturated on a host several times faster
MIN_SCALE = 0.25  # below this the registered protocol would take 4x its time here: refused


class HostScaleError(ConfigError):
    """The host's scale cannot be measured or is outside what a run here may use."""


@dataclass(frozen=True)
class HostScale:
    """The measured scale and what it was measured from (kept in the test's report)."""

    scale: float
    host_token_rate: float  # uncached tokens/s here, cache off, population n
    registered_token_rate: float  # the registration's all_miss_token_rate
    n: int
    warmup_s: float
    window_s: float
    run_dir: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def registered_e0a_protocol(reg: Any) -> dict[str, float]:
    """The registered E0a's protocol (warmup_s, window_s, n), read strictly from the registration's
    bound E0a input (analysis.calibration_summaries.load_summary)."""
    found = reg.bound_input("e0a")
    if found is None:
        raise HostScaleError(f"registration {reg.name}: no bound input of stage e0a ({[i.path for i in reg.inputs]})")
    e0a = load_summary(found[0], "e0a")
    assert isinstance(e0a, E0a)  # load_summary with stage "e0a" returns the E0a model or raises
    p = e0a.protocol
    return {"warmup_s": p.warmup_s, "window_s": p.window_s, "n": p.n}


def measure_host_scale(
    reg: Any, engine: Any, run_dir: Path | str, *, population_factor: int = POPULATION_FACTOR, seed: int = 0
) -> HostScale:
    """Run the cell's cache-off engine saturated (one closed run) and return s.

    `engine` is the runs.realrun.EngineOptions of the real engine (None: the engine model in
    virtual time, whose s is that of the model against the registration's references)."""
    proto = registered_e0a_protocol(reg)
    bundle = reg.bundle()
    n = int(proto["n"]) * int(population_factor)
    run = run_closed(
        cache_off(bundle.cell),
        bundle.workload,
        n,
        seed=seed,
        warmup=proto["warmup_s"],
        window=proto["window_s"],
        run_dir=run_dir,
        meta={"stage": "host-scale", "registration": reg.name},
        engine=engine,
    )
    registered = float(reg.references.all_miss_token_rate)
    host = float(run.stats.uncached_token_rate)
    if not registered > 0 or not host > 0:
        raise HostScaleError(f"host scale: token rates must be positive (here {host:g}, registered {registered:g})")
    scale = host / registered
    if scale < MIN_SCALE:
        raise HostScaleError(
            f"host scale {scale:.3f} (here {host:,.0f} uncached tokens/s, registered {registered:,.0f}): this host is "
            f"more than {1 / MIN_SCALE:g}x slower than the calibrating one; run on a faster host or re-calibrate here"
        )
    return HostScale(scale, host, registered, n, proto["warmup_s"], proto["window_s"], str(run_dir))
