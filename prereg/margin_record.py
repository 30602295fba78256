"""How sure a simulator prediction is: its flip margins as a prediction file records them, and the
knife-edge label against the calibration's own noise.

Why a label at all: a prediction whose state flips when the engine is 2% faster says little about
a real engine if E0a itself cannot tell the engine's speed to better than 5%: its hit or miss is
then a coin the calibration tossed, and scores that mix such predictions with robust ones hide how
good the robust ones are. So each margin is compared, at make time, with E0a's seed spread, and
the label is frozen with the prediction (prereg/scoring.py reports the two groups apart).

The noise (`e0a_noise`): the relative sample standard deviation (ddof 1) over E0a's seeds of

- the all-miss uncached token rate, for the speed margin: E0a's token rate is the engine's speed as
  the calibration measures it (the all-miss reference moves with the speed, prereg/margin.py);
- the turns-based all-miss rate mu_turns (whose mean is lambda_ref), for the lambda_ref margin.

Why the standard deviation of one seed, not the standard error of the mean, nor the half-range:
the registered test meets the engine one run at a time, and one E0a seed is one such reading of
it, so a margin smaller than the scatter of one reading is a flip the calibration cannot rule out;
the s.e. (that / sqrt(n)) describes the registered mean, not a run, and would call fewer
predictions knife-edge than the calibration's own repeatability allows; the half-range grows with
the number of seeds (for three it is about 0.85 sd), so its meaning would change with E0a's size.
With fewer than two seeds there is no spread, and the label is "unjudged".

A side (knob and direction) is inside the noise when the state flips at a change of at most the
noise; the bisection tries the noise first (prereg/margin.py `_bisect`'s probe), so this is known
exactly, not to within the bisection's tolerance. A prediction is "knife-edge" when any side is
inside, "robust" when no side is and both noises are known, else "unjudged".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from analysis.calibration_summaries import E0a, load_summary
from prereg.margin import DIRECTIONS, KNOBS, FlipMargin
from prereg.predictions import MARGIN_LABELS
from provenance.meta import sha256_file

LABELS = MARGIN_LABELS
# the E0a column whose seed spread is each knob's noise
NOISE_COLUMNS = {"speed": "uncached_token_rate", "lambda_ref": "mu_turns"}


def rel_sd(values: Sequence[float]) -> float | None:
    """Relative sample standard deviation (ddof 1) of `values`; None for fewer than two."""
    if len(values) < 2:
        return None
    m = math.fsum(values) / len(values)
    var = math.fsum((v - m) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / m if m > 0 else None


def e0a_noise(e0a: E0a) -> dict[str, Any]:
    """Each knob's noise from E0a's per-seed rows, with where it came from (the module doc says why)."""
    rows = list(e0a.per_seed)
    out: dict[str, Any] = {
        "statistic": "relative sample standard deviation (ddof 1) over E0a's seeds",
        "seeds": [r.seed for r in rows],
    }
    for knob, col in NOISE_COLUMNS.items():
        vals = [getattr(r, col) for r in rows if getattr(r, col) is not None]
        sd = rel_sd(vals)
        out[knob] = None if sd is None else round(sd, 6)
        out[f"{knob}_from"] = f"E0a per_seed.{col}"
    return out


def load_e0a_noise(path: str | Path, shown: str | None = None) -> dict[str, Any]:
    """`e0a_noise` of an E0a summary file, read strictly (analysis.calibration_summaries); the file
    is recorded as `shown` (a repository path) when given, else as given."""
    e0a = load_summary(path, "e0a")
    assert isinstance(e0a, E0a)  # load_summary with stage "e0a" returns the E0a model or raises
    out = e0a_noise(e0a)
    out["e0a"] = {"path": shown if shown is not None else Path(path).as_posix(), "sha256": sha256_file(path)}
    return out


def _sides(m: FlipMargin, knob: str) -> dict[str, float | None]:
    up, down = DIRECTIONS[knob]
    return {up: m.faster, down: m.slower}


def margin_record(
    margins: Mapping[str, FlipMargin], noise: Mapping[str, Any] | None, of: str, max_change: float
) -> dict[str, Any]:
    """The `margin` block of one prediction: per knob the change that flips each side (null: none
    up to max_change), the noise, the sides inside it, the smallest margin and the label."""
    rec: dict[str, Any] = {"of": of, "state": next(iter(margins.values())).base}
    sides: dict[str, dict[str, float | None]] = {k: _sides(m, k) for k, m in margins.items()}
    for knob, s in sides.items():
        rec[knob] = {**s, "noise": None if noise is None else noise.get(knob)}
    return _finish(rec, sides, noise, max_change)


def noise_label(
    sides: Mapping[str, Mapping[str, float | None]],
    noise: Mapping[str, float | None] | None,
    required: Sequence[str] = KNOBS,
) -> tuple[list[tuple[str, str]], str]:
    """The sides (knob, direction) whose flip margin is within that knob's noise, and the label:
    "knife-edge" when any side is, "robust" when none is and every `required` knob was judged (its
    margins found and its noise known), else "unjudged". One rule for a prediction's margins (both
    knobs required) and a replay's (sim2real/replay_margin.py: speed only, the one knob a replay
    moves), so the two labels cannot drift apart."""
    inside: list[tuple[str, str]] = []
    judged = set(sides) >= set(required)
    for knob, s in sides.items():
        nz = None if noise is None else noise.get(knob)
        if nz is None:
            judged = False
        for side, m in s.items():
            if m is not None and nz is not None and m <= nz + 1e-9:
                inside.append((knob, side))
    return inside, "knife-edge" if inside else ("robust" if judged else "unjudged")


def _finish(
    rec: dict[str, Any],
    sides: Mapping[str, Mapping[str, float | None]],
    noise: Mapping[str, Any] | None,
    max_change: float,
) -> dict[str, Any]:
    inside, label = noise_label(sides, noise)
    bounded = [m for s in sides.values() for m in s.values() if m is not None]
    rec["margin"] = min(bounded) if bounded else max_change
    rec["bounded"] = bool(bounded)
    rec["inside_noise"] = [f"{knob} {side}" for knob, side in inside]
    rec["label"] = label
    return rec


def combined_record(
    records: Sequence[Mapping[str, Any]], noise: Mapping[str, Any] | None, of: str, max_change: float
) -> dict[str, Any]:
    """The margin of a prediction about several runs' states at once (a seed's "every arm good", a
    rate's PASS): per side the smallest change that flips any of them."""
    sides: dict[str, dict[str, float | None]] = {}
    for knob in KNOBS:
        if not all(knob in r for r in records):
            continue
        sides[knob] = {}
        for side in DIRECTIONS[knob]:
            vals = [r[knob][side] for r in records if r[knob][side] is not None]
            sides[knob][side] = min(vals) if vals else None
    rec: dict[str, Any] = {"of": of, "state": "/".join(str(r["state"]) for r in records)}
    for knob, s in sides.items():
        rec[knob] = {**s, "noise": None if noise is None else noise.get(knob)}
    return _finish(rec, sides, noise, max_change)
