"""Finite numbers only: the one check every input format shares (configs, cost files, calibration
summaries, registrations, prediction files).

Why: YAML reads `.inf` and `.nan` (and a float too large to hold, e.g. `1e400`) as floats, and a
float comparison lets them through almost every bound a field declares: `inf > 0` holds, so a
calibration summary with `mu_sessions: .inf` used to fill a FILLED registration whose cap drains
in 0 s. No quantity a registered test uses is infinite or undefined; a field that may legitimately
be unbounded says so in its description and takes null instead.

Two layers, one rule: `nonfinite_fields` walks any loaded document (typed fields and free-form
mappings such as a rule's parameters alike) and is run by every reader before validation, so the
refusal names the file, the field path and the value; `StrictModel` is the base of every pydantic
model of those formats, with pydantic's own `allow_inf_nan=False`, so a model built in memory (a
filled registration) refuses them too.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.errors import AgentloadError, ConfigError

FINITE_EXPECTED = "a finite number (inf and NaN are refused; a field that may be unbounded takes null)"


class StrictModel(BaseModel):
    """Unknown keys are errors, models are immutable, defaults are validated, floats are finite."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


def _loc(parts: tuple[Any, ...]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def nonfinite_fields(data: Any) -> list[tuple[str, float]]:
    """Every (field path, value) in `data` whose value is an infinite or NaN float, in document order.

    Walks mappings, lists and tuples; paths read like `points[0].mu_sessions`."""
    found: list[tuple[str, float]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                found.append((_loc(path), value))
        elif isinstance(value, Mapping):
            stack.extend(((*path, k), v) for k, v in reversed(list(value.items())))
        elif isinstance(value, (list, tuple)):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(value))))
    return found


def check_finite(data: Any, source: Path | str, error: type[AgentloadError] = ConfigError) -> None:
    """Raise `error` naming the file, each non-finite field and its value; return if there is none."""
    found = nonfinite_fields(data)
    if not found:
        return
    if len(found) == 1:
        loc, value = found[0]
        raise error(f"{source}: {loc}: got {value!r}; expected {FINITE_EXPECTED}")
    lines = [f"{source}: {len(found)} non-finite numbers; expected {FINITE_EXPECTED}"]
    lines += [f"  {loc}: got {value!r}" for loc, value in found]
    raise error("\n".join(lines))
