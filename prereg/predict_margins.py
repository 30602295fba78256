"""The flip margins a simulator prediction file carries (`predict make sim`): per arm x rate the
margins of the fresh seeds' modal state, per registered seed those of the exact plan's state, and
for a seed's or a rate's prediction the nearest flip of any arm at that rate.

Why here and not in the maker: the maker says what is predicted; this says how sure each
prediction is, with the same bisection the design step uses (prereg/margin.py `cell_margins`) and
the label of prereg/margin_record.py. The cost is kept bounded: the runs the predictions were made
from are reused at factor 1, the noise is tried first, a direction that does not flip at the
largest change costs one evaluation, and a modal state stops at a majority of its seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.config import TestBundle
from prereg.margin import DEFAULT_MAX_CHANGE, DEFAULT_TOLERANCE, KNOBS, cell_margins
from prereg.margin_record import combined_record, load_e0a_noise, margin_record
from prereg.predict_makers import is_registration_file
from prereg.predictions import Prediction
from prereg.registration import load_registration
from runs.arms import references

RunKey = tuple[str, float, int]


def noise_for(test_path: str | Path, registration: str | Path | None, e0a: str | Path | None) -> dict[str, Any] | None:
    """E0a's seed spread: from `e0a` if given, else from the E0a input the registration binds
    (the test itself when it is a registration); None when neither names one."""
    if e0a is not None:
        return load_e0a_noise(e0a)
    reg = registration if registration is not None else (test_path if is_registration_file(test_path) else None)
    if reg is None:
        return None
    found = load_registration(reg).bound_input("e0a")
    return None if found is None else load_e0a_noise(*found)


@dataclasses.dataclass
class PlanMargins:
    fresh: dict[tuple[str, float], dict[str, Any]]
    exact: dict[RunKey, dict[str, Any]]
    simulated: int


def plan_margins(
    bundle: TestBundle,
    spec: Mapping[str, Any],
    arms: Sequence[str],
    rates: Sequence[float],
    fresh: Sequence[int],
    exact_seeds: Sequence[int],
    verdicts: Mapping[RunKey, Mapping[str, Any]],
    *,
    noise: Mapping[str, Any] | None,
    tol: float = DEFAULT_TOLERANCE,
    max_change: float = DEFAULT_MAX_CHANGE,
    jobs: int = 1,
) -> PlanMargins:
    """Margin records of every arm x rate (fresh seeds' modal state) and, for `exact_seeds`, of
    every registered run's exact-plan state; `verdicts` are the prediction's own judged runs."""
    refs = references(bundle)
    nz = None if noise is None else {k: noise.get(k) for k in KNOBS}
    out = PlanMargins({}, {}, 0)
    pool: Executor | None = ProcessPoolExecutor(max_workers=jobs) if jobs > 1 else None

    def one(arm: str, rate: float, seeds: Sequence[int]) -> tuple[dict[str, Any], int]:
        known = {s: (verdicts[(arm, rate, s)]["state"], verdicts[(arm, rate, s)]["stats"]) for s in seeds}
        cm = cell_margins(
            bundle,
            arm,
            rate,
            seeds,
            spec,
            refs,
            known=known,
            noise=nz,
            max_change=max_change,
            tol=tol,
            pool=pool,
            jobs=jobs,
        )
        of = (
            f"the modal state of fresh seeds {list(seeds)}"
            if seeds is fresh
            else f"the state of seed {seeds[0]}'s own plan"
        )
        return margin_record(cm.margins, noise, of, max_change), cm.simulated

    tasks: list[tuple[Any, str, float, Sequence[int]]] = []
    for a in arms:
        for r in rates:
            tasks.append(((a, r), a, r, fresh))
            tasks += [((a, r, s), a, r, [s]) for s in exact_seeds]
    try:
        # each arm x rate's bisection is a chain of dependent runs: with workers, the chains run side
        # by side (threads that wait on the shared process pool), so no worker idles while one chain waits
        if pool is None:
            done = [one(a, r, seeds) for _, a, r, seeds in tasks]
        else:
            with ThreadPoolExecutor(max_workers=2 * jobs) as threads:
                done = list(threads.map(lambda t: one(*t[1:]), tasks))
        for (key, *_), (rec, n) in zip(tasks, done, strict=True):
            (out.fresh if len(key) == 2 else out.exact)[key] = rec
            out.simulated += n
    finally:
        if pool is not None:
            pool.shutdown()
    return out


def with_margins(
    preds: Sequence[Prediction], pm: PlanMargins, noise: Mapping[str, Any] | None, max_change: float
) -> list[Prediction]:
    """Each prediction with its margin block: a run's from its layer (fresh or exact), a seed's or a
    rate's the nearest flip of any arm's fresh modal state at that rate."""
    out = []
    for p in preds:
        a, r = p.about.arm, p.about.rate
        rec: dict[str, Any] | None = None
        if p.about.scope == "run" and a is not None and r is not None:
            if p.source.get("layer") == "exact plan" and p.about.seed is not None:
                rec = pm.exact.get((a, r, p.about.seed))
            else:
                rec = pm.fresh.get((a, r))
        elif p.about.scope in ("seed", "rate") and r is not None:
            recs = [v for (_arm, rate), v in pm.fresh.items() if rate == r]
            if recs:
                of = "every arm's modal state at this rate (the nearest flip)"
                rec = combined_record(recs, noise, of, max_change)
        out.append(dataclasses.replace(p, margin=rec) if rec is not None else p)
    return out
