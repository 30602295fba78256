"""Pin a CPU engine's speed, not its share: search the CPU quota until an all-miss probe reads the
cell's token rate (the cell's `engine_speed_pin`, harness.config.SpeedPin).

Why: a kernel quota (harness/servers/cpuquota.py) gives the engine the same share of a CPU on every
host, but CPUs of one kind are not equally fast: the quota'd CPU vLLM cell served 1.21-1.26x its
registered all-miss token rate on another 2-core host of the same family, so the registered rule
called a plainly trapped run INDETERMINATE. What the registration's references need is the engine's
*speed*. So, once the server answers its health check and before the smoke checks and the canary,
a probe sends `requests` unique prompts at once (random ids, no prefix shared with anything, so
every token is a miss), the uncached prompt tokens over the wall time from the first send to the
last reply is the rate, and the quota is moved until the rate is within `tolerance` of the target:
first in proportion (a CPU-bound engine's rate grows about linearly with its quota), then along
the power law the last two probes give (a secant in log-log; on a shared host the speed a quota
gives drifts with the others' load, so only the latest probes count). A host that cannot reach
the rate at `max_cpu_quota` is refused with what it reached (SpeedPinError, an EngineStartError)
once SLOW_CONFIRM probes in a row say so (a probe below the largest quota says so when even the
fastest growth the search trusts, ALPHA_MAX, could not get it there; it then sends the next probe
straight to the largest quota, so a host whose speed dipped for a minute gets a second look and a
truly slow one is refused after two probes); so is one still too fast at `min_cpu_quota`, and a
search that does not settle in `max_steps`.
The cache is flushed after the probe, so the canary that follows checks that nothing is left.

The search (`next_quota`) is a pure function of the steps so far, tested with fake rate functions;
`search_quota` drives it synchronously, `pin_speed` against a live server.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.config import SpeedPin
from harness.servers.base import EngineStartError
from harness.servers.keepalive import engine_session

if TYPE_CHECKING:
    import aiohttp

    from harness.servers.base import EngineAdapter

PROBE_SEED = 0x5EED_0F_5BEED  # probe prompts: a fixed generator, a fresh draw per step
WARMUP_STEP = 1 << 20  # the unmeasured warm-up's draw (never a step of the search)
# How a CPU engine's rate may grow with its quota, rate ~ quota^alpha: the secant between two probes
# is trusted inside this range (outside it the pair is noise or drift). Measured on the CPU SGLang,
# 0.89 from 0.6 to 1.0 CPU and 1.20 from 1.0 to 1.4 (a small quota is throttled in bursts, so the
# rate can grow a little faster than the quota); ALPHA_MAX also bounds what the largest quota could
# give, so a host that falls short even at that growth is refused after its first probe, not after
# walking up to the largest quota (three probes, about 1.5 minutes, on an AVX2-only EPYC serving an
# AVX-512 host's cell).
ALPHA_MIN, ALPHA_MAX = 0.3, 1.5
# How many probes in a row must read short of the target at the largest quota (or be out of reach of
# it) before a host is refused as too slow. One is not enough on a shared host: in one SLURM
# submission of the fp32 CPU cell, 1.7 CPU read 12,000 and 18,572 tokens/s a minute apart, and jobs
# were refused on a single slow probe projected to 1.7 CPU.
SLOW_CONFIRM = 2


class SpeedPinError(EngineStartError):
    """The engine's speed could not be pinned to the cell's (host too slow, too fast, or unsettled)."""

    def __init__(self, message: str, record: dict[str, Any] | None = None) -> None:
        self.record = record or {}
        super().__init__("speed_pin", message)


@dataclass(frozen=True)
class Step:
    """One probe: the quota it ran under and what it measured."""

    quota: float
    token_rate: float
    tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Decision:
    """What the search does next: 'measure' at `quota`, or stop ('pinned' / 'refused')."""

    action: str
    quota: float | None = None
    reason: str = ""


def within(rate: float, target: float, tolerance: float) -> bool:
    return abs(rate / target - 1.0) <= tolerance


def reach(step: Step, hi: float) -> float:
    """The most a probe says the largest quota `hi` could give: its rate where it ran at `hi`, else
    grown as quota^ALPHA_MAX, the fastest growth the search trusts (so it never understates)."""
    if step.quota >= hi * (1 - 1e-9) or step.token_rate <= 0:
        return step.token_rate
    return float(step.token_rate * (hi / step.quota) ** ALPHA_MAX)


def _slow_reading(step: Step, hi: float) -> str:
    if step.quota >= hi * (1 - 1e-9):
        return f"the probe read {step.token_rate:.0f} uncached tokens/s at {step.quota:.3g} CPU"
    return (
        f"the probe read {step.token_rate:.0f} uncached tokens/s at {step.quota:.3g} CPU (even growing as "
        f"quota^{ALPHA_MAX:g}, at most {reach(step, hi):.0f} at {hi:g} CPU)"
    )


def next_quota(steps: Sequence[Step], pin: SpeedPin, start: float) -> Decision:
    """The search's next move from the probes so far (pure: tests drive it with fake rates)."""
    lo, hi, T = pin.min_cpu_quota, pin.max_cpu_quota, pin.token_rate
    if not steps:
        return Decision("measure", min(max(start, lo), hi))
    last = steps[-1]
    if within(last.token_rate, T, pin.tolerance):
        return Decision(
            "pinned",
            last.quota,
            f"{last.token_rate:.0f} tokens/s at {last.quota:.3g} CPU (target {T:.0f} +- {pin.tolerance:.0%})",
        )
    # Too slow only on evidence that repeats: the last SLOW_CONFIRM probes all short of the target even
    # at the largest quota (a probe there as read, one below it grown as quota^ALPHA_MAX, which can
    # only overstate what the largest quota gives). One short probe sends the next to the largest
    # quota instead: a host whose speed dips for a minute is probed again where it is most likely to
    # reach the target, and a truly slow host costs one probe more than refusing at once would.
    if last.token_rate < T * (1 - pin.tolerance):
        recent = steps[-SLOW_CONFIRM:]
        if len(recent) == SLOW_CONFIRM and all(reach(s, hi) < T * (1 - pin.tolerance) for s in recent):
            said = "; ".join(_slow_reading(s, hi) for s in recent)
            return Decision(
                "refused",
                None,
                f"host too slow: {SLOW_CONFIRM} probes in a row short of the cell's {T:.0f} - {pin.tolerance:.0%} "
                f"at the largest allowed quota {hi:g} CPU: {said}",
            )
    if last.token_rate > T and last.quota <= lo * (1 + 1e-9):
        return Decision(
            "refused",
            None,
            f"host too fast: the probe read {last.token_rate:.0f} uncached tokens/s at the smallest allowed "
            f"quota {lo:g} CPU, above the cell's {T:.0f} + {pin.tolerance:.0%}",
        )
    if len(steps) >= pin.max_steps:
        best = min(steps, key=lambda s: abs(math.log(s.token_rate / T)) if s.token_rate > 0 else math.inf)
        return Decision(
            "refused",
            None,
            f"speed not settled in {pin.max_steps} probes: closest {best.token_rate:.0f} tokens/s at "
            f"{best.quota:.3g} CPU (target {T:.0f} +- {pin.tolerance:.0%}); rates "
            f"{[round(s.token_rate) for s in steps]}",
        )
    if last.token_rate > 0 and reach(last, hi) < T * (1 - pin.tolerance):
        return Decision("measure", hi)  # short even at the largest quota once: see there, before refusing
    # Move along rate ~ quota^alpha through the last probe, alpha from the last two probes (a secant in
    # log-log; 1 = proportional until there are two). Only the last two: on a shared host the speed a
    # quota gives drifts with the others' load, and an older probe no longer says what the quota gives.
    alpha = 1.0
    if len(steps) >= 2:
        p0, p1 = steps[-2], steps[-1]
        if p0.quota != p1.quota and p0.token_rate > 0 and p1.token_rate > 0:
            a = math.log(p1.token_rate / p0.token_rate) / math.log(p1.quota / p0.quota)
            if ALPHA_MIN <= a <= ALPHA_MAX:  # a flat or inverted pair is noise (or drift), not the engine
                alpha = a
    ratio = T / last.token_rate if last.token_rate > 0 else 2.0
    q = last.quota * min(max(ratio ** (1.0 / alpha), 0.5), 2.0)  # at most a factor of two a step
    return Decision("measure", min(max(q, lo), hi))


@dataclass
class PinResult:
    """The search's outcome, as a run's meta.json records it (`engine_speed_pin`)."""

    pinned: bool
    quota: float | None
    token_rate: float | None
    target: float
    tolerance: float
    steps: list[Step] = field(default_factory=list)
    reason: str = ""
    seconds: float = 0.0
    flushed: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = [asdict(s) for s in self.steps]
        d["ratio"] = None if self.token_rate is None else self.token_rate / self.target
        return d


def search_quota(measure: Callable[[float], Step | float], pin: SpeedPin, start: float) -> PinResult:
    """Probe, adjust, probe until pinned or refused; `measure(quota)` sets the quota and probes."""
    steps: list[Step] = []
    while True:
        d = next_quota(steps, pin, start)
        if d.action != "measure":
            break
        assert d.quota is not None  # next_quota gives every "measure" its quota
        got = measure(float(d.quota))
        steps.append(got if isinstance(got, Step) else Step(float(d.quota), float(got)))
    last = steps[-1]
    ok = d.action == "pinned"
    return PinResult(
        ok, last.quota if ok else None, last.token_rate if ok else None, pin.token_rate, pin.tolerance, steps, d.reason
    )


# ---------------------------------------------------------------------------------------------
# the probe on a live server
# ---------------------------------------------------------------------------------------------
def probe_prompts(pin: SpeedPin, step: int) -> list[np.ndarray]:
    """`requests` prompts of `prompt_tokens` random ids, a fresh draw per step (nothing shared)."""
    rng = np.random.default_rng([PROBE_SEED, step])
    return [rng.integers(4, 32000, size=pin.prompt_tokens, dtype=np.int32) for _ in range(pin.requests)]


async def probe_once(adapter: EngineAdapter, http: aiohttp.ClientSession, base_url: str, model_name: str, pin: SpeedPin,
                     step: int, quota: float) -> Step:  # fmt: skip
    """Send one probe's prompts (`concurrency` in flight, else all at once); the uncached prompt
    tokens over the time from the first send to the last reply."""
    prompts = probe_prompts(pin, step)
    gate = asyncio.Semaphore(pin.concurrency or len(prompts))

    async def one(p: np.ndarray) -> Any:
        async with gate:
            return await adapter.complete(http, base_url, p, pin.max_tokens, model_name)

    t0 = time.monotonic()
    done = await asyncio.gather(*(one(p) for p in prompts))
    dt = time.monotonic() - t0
    uncached = sum(
        int(d.prompt_tokens if d.prompt_tokens is not None else len(p)) - int(d.cached_tokens)
        for d, p in zip(done, prompts)
    )
    return Step(quota, uncached / dt if dt > 0 else math.inf, uncached, round(dt, 4))


async def pin_speed(adapter: EngineAdapter, base_url: str, cell_pin: SpeedPin, start: float, model_name: str,
                    set_quota: Callable[[float], float]) -> PinResult:  # fmt: skip
    """Pin a live server's speed: warm up, then probe and set the quota (`set_quota(cores) -> cores
    as read back`) until pinned; flush the cache after. Raises SpeedPinError when refused."""
    t0 = time.monotonic()
    steps: list[Step] = []
    async with engine_session() as http:
        set_quota(min(max(start, cell_pin.min_cpu_quota), cell_pin.max_cpu_quota))
        warm = cell_pin.model_copy(update={"requests": max(1, cell_pin.requests // 4)})
        await probe_once(
            adapter, http, base_url, model_name, warm, WARMUP_STEP, start
        )  # first requests after a start run slow: not measured
        while True:
            d = next_quota(steps, cell_pin, start)
            if d.action != "measure":
                break
            assert d.quota is not None  # next_quota gives every "measure" its quota
            q = set_quota(float(d.quota))
            steps.append(await probe_once(adapter, http, base_url, model_name, cell_pin, len(steps), q))
        if d.action == "pinned":
            set_quota(steps[-1].quota)  # the pinned quota stays for the run (it is the last one set)
        await adapter.flush_cache(http, base_url)  # the probe's blocks out of the pool; the canary checks it
        flushed = True
    ok = d.action == "pinned"
    last = steps[-1]
    res = PinResult(
        ok,
        last.quota if ok else None,
        last.token_rate if ok else None,
        cell_pin.token_rate,
        cell_pin.tolerance,
        steps,
        d.reason,
        round(time.monotonic() - t0, 3),
        flushed,
    )
    if not ok:
        raise SpeedPinError(f"engine speed pin refused: {d.reason}", res.to_json())
    return res


def pin_blocking(adapter: EngineAdapter, base_url: str, pin: SpeedPin, start: float, model_name: str,
                 set_quota: Callable[[float], float]) -> PinResult:  # fmt: skip
    return asyncio.run(pin_speed(adapter, base_url, pin, start, model_name, set_quota))


async def measure_at(
    adapter: EngineAdapter,
    base_url: str,
    pin: SpeedPin,
    model_name: str,
    quotas: Sequence[float],
    repeats: int,
    set_quota: Callable[[float], float],
) -> list[Step]:
    """The probe's rate at each quota, `repeats` times (what a cell's token_rate is measured with)."""
    out: list[Step] = []
    async with engine_session() as http:
        set_quota(quotas[0])
        await probe_once(
            adapter,
            http,
            base_url,
            model_name,
            pin.model_copy(update={"requests": max(1, pin.requests // 4)}),
            WARMUP_STEP,
            quotas[0],
        )
        for q in quotas:
            got = set_quota(q)
            for _ in range(repeats):
                out.append(await probe_once(adapter, http, base_url, model_name, pin, len(out), got))
        await adapter.flush_cache(http, base_url)
    return out


def measure_blocking(
    adapter: EngineAdapter,
    base_url: str,
    pin: SpeedPin,
    model_name: str,
    quotas: Sequence[float],
    repeats: int,
    set_quota: Callable[[float], float],
) -> list[Step]:
    return asyncio.run(measure_at(adapter, base_url, pin, model_name, quotas, repeats, set_quota))


RECHECK_STEP = 1 << 21  # the after-run probe's draw


async def recheck(adapter: EngineAdapter, base_url: str, pin: SpeedPin, model_name: str, quota: float, *,
                  wait_idle_s: float = 30.0) -> Step | str:  # fmt: skip
    """One probe at the quota already set (after a run: did the speed hold?), or why not: an engine
    still serving what the run left after `wait_idle_s` (a trapped run ends with hundreds queued)
    would not measure its speed. The cache is flushed after it."""
    async with engine_session() as http:
        deadline = time.monotonic() + wait_idle_s
        while True:
            gauges = await adapter.scrape_metrics(http, base_url)
            busy = {k: gauges[k] for k in ("running", "waiting") if gauges.get(k)}
            if not busy:
                break
            if time.monotonic() >= deadline:
                return f"not probed: the engine was still busy {wait_idle_s:g} s after the run ({busy})"
            await asyncio.sleep(0.5)
        step = await probe_once(adapter, http, base_url, model_name, pin, RECHECK_STEP, quota)
        await adapter.flush_cache(http, base_url, timeout=30.0)
    return step
