"""What every way of filling a registration shares: the result, the frozen plans' hashes, the
arms as configured, the cell as a registration records it, repository-relative paths.

Why apart: a registration is filled by formula from calibration inputs (prereg/fill.py), derived
EXPLORATORY from a FILLED parent or based on a FILLED registration's calibration
(prereg/derive.py); each writes these parts the same way, so that equal inputs give equal bytes
whichever way was taken.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from harness.config import (
    DEFAULT_TOP_RATE,
    ArmConfig,
    CellConfig,
    ProtocolConfig,
    WorkloadConfig,
    config_ref,
    load_config,
)
from harness.errors import ConfigError
from harness.workload.planfile import plan_bytes
from harness.workload.plans import make_plan, plan_arm
from prereg.registration import Registration, RegistrationError
from provenance.git import GitError, Repo


@dataclass(frozen=True)
class FillResult:
    registration: Registration
    data: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        """What a person checks first: status, window, rates, cap, drains, warnings."""
        r = self.registration
        f = r.fill
        return {
            "name": r.name,
            "status": r.status,
            "status_reasons": r.status_reasons,
            "window": f.get("window"),
            "band": f.get("band"),
            "rates": [x.multiple for x in r.rates],
            "rates_sessions_per_s": [x.sessions_per_s for x in r.rates],
            "cap": f.get("cap"),
            "drain": f.get("drain"),
            "warnings": [w.model_dump() for w in r.warnings],
        }


def rel_path(path: Path, root: Path | None) -> str:
    p = path.resolve()
    if root is not None:
        try:
            return p.relative_to(root.resolve()).as_posix()
        except ValueError:
            pass
    return p.as_posix()


def repo_root_of(path: Path) -> Path | None:
    """The git working tree holding `path`, for repository-relative paths (None outside one)."""
    try:
        return Repo.containing(path).path
    except (GitError, OSError):  # pragma: no cover - outside a repository
        return None


def arm_configs(names: list[str], base: Path, cap: int | None, source: str) -> dict[str, ArmConfig]:
    out: dict[str, ArmConfig] = {}
    for name in names:
        arm = load_config(config_ref(name, "arms"), ArmConfig, base)
        try:
            arm.gate_cap(cap)
        except ConfigError as exc:
            raise RegistrationError(f"{source}: arms: {name}: {exc}") from None
        out[name] = arm
    return out


def plan_hashes(
    workload: WorkloadConfig,
    protocol: ProtocolConfig,
    arms: dict[str, ArmConfig],
    multiples: list[float],
    lambda_ref: float,
    seeds: list[int],
    top_rate: float = DEFAULT_TOP_RATE,
) -> list[dict[str, Any]]:
    """SHA-256 of every frozen plan (arm x rate x seed), generated exactly as a job generates it
    (from the base stream at the test's `top_rate`). Arms whose plan content is the same (BURST and
    CAPPED) share one generation."""
    cache: dict[tuple[bytes, float, int], str] = {}
    out = []
    for name, arm in arms.items():
        key_arm = orjson.dumps(plan_arm(arm, protocol), option=orjson.OPT_SORT_KEYS)
        for m in multiples:
            for s in seeds:
                k = (key_arm, m, s)
                if k not in cache:
                    cache[k] = hashlib.sha256(
                        plan_bytes(make_plan(workload, protocol, arm, m, lambda_ref, s, top_rate))
                    ).hexdigest()
                out.append({"arm": name, "rate": m, "seed": s, "sha256": cache[k]})
    return out


def cell_dump(cell: CellConfig, lambda_ref: float, all_miss: float | None) -> dict[str, Any]:
    d = cell.model_dump(mode="json")
    d["cost_file"] = None  # costs inline: the registration must not change when a cost file does
    d["lambda_ref"] = lambda_ref
    d["all_miss_token_rate"] = all_miss
    return d
