"""CostModel's closed forms against the iteration costs they stand for, bit for bit.

The fused planners (harness/refengine/fused.py) take their step times from these forms instead of
calling mixed_iteration once a step, and every record must stay what stepping gives: so the ends
are compared as floats with ==, not within a tolerance."""

from __future__ import annotations

import math
import random

from harness.config.cost import CostModel


def _stepped(cost: CostModel, now: float, R: int, ctx: int, kmax: int, horizon: float) -> list[float]:
    """The fused planner's former loop: one mixed_iteration call a step."""
    ends: list[float] = []
    end = now
    while len(ends) < kmax:
        nxt = end + cost.mixed_iteration(0, 0.0, R, float(ctx + len(ends) * R))
        if not nxt < horizon:
            break
        ends.append(nxt)
        end = nxt
    return ends


def _costs(rng: random.Random, n: int) -> list[CostModel]:
    out = [CostModel(), CostModel(speed=1.37, token_factor=0.83), CostModel(f0=0.5, c_r=0.01)]
    for _ in range(n):
        out.append(
            CostModel(
                a=rng.uniform(0, 2e-2),
                f0=rng.choice([0.0, rng.uniform(0, 5e-3)]),
                b=rng.uniform(0, 1e-4),
                c_p=rng.uniform(0, 1e-7),
                c_d=rng.uniform(0, 3e-2),
                speed=rng.uniform(0.2, 5.0),
                token_factor=rng.uniform(0.3, 2.0),
                c_r=rng.uniform(0, 1e-2),
            )
        )
    return out


def test_mixed_decode_ends_are_the_stepped_ends_bit_for_bit() -> None:
    rng = random.Random(7)
    checked = 0
    for cost in _costs(rng, 60):
        for _ in range(20):
            now = rng.uniform(0, 9000)
            R = rng.randint(1, 512)
            ctx = rng.randint(R, 300_000)
            kmax = rng.randint(1, 300)
            horizon = now + rng.choice([rng.uniform(0, 2.0), math.inf])
            got = cost.mixed_decode_ends(now, R, ctx, kmax, horizon)
            want = _stepped(cost, now, R, ctx, kmax, horizon)
            assert got == want, (cost, now, R, ctx, kmax, horizon)
            checked += len(want)
    assert checked > 10_000  # the comparison saw many steps, not only empty runs


def test_mixed_decode_ends_stop_before_the_horizon_and_at_max_iters() -> None:
    cost = CostModel()
    ends = cost.mixed_decode_ends(0.0, 16, 16 * 4000, 1000, 0.5)
    assert ends and ends[-1] < 0.5 and len(ends) < 1000
    assert cost.mixed_decode_ends(0.0, 16, 16 * 4000, 3, math.inf) == _stepped(cost, 0.0, 16, 16 * 4000, 3, math.inf)
    assert len(cost.mixed_decode_ends(0.0, 16, 16 * 4000, 3, math.inf)) == 3
    assert cost.mixed_decode_ends(1.0, 16, 1000, 10, 1.0) == []  # no step ends before a horizon at now
