"""How far a replay's state is from flipping: the flip margin of a replayed real run.

Why: a replay that classes a run as the real run was classed says the simulator reproduces it only
if a small error in the cost would not have changed the call. The margin is the one the frozen
predictions carry (prereg/margin.py): the smallest relative change of the cost's speed, each way,
at which the replayed state differs, by bisection; every evaluation is a replay of the same plan,
arm and cell with the speed moved (sim2real/replay.py `speed_factor`). As there, the all-miss token
reference (where the run records one) moves with the speed, so a margin measures whether the trap
forms (or the good state holds) rather than re-counting the rule's token-rate tolerance. A margin
within the calibration's own noise (the relative seed spread of E0a's uncached token rate, from the
E0a summary the run's registration binds) is labelled knife-edge (prereg/margin_record.py's labels).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from analysis.paired import paired_run
from analysis.staged_analysis import run_quantities
from harness.errors import AgentloadError
from prereg.margin import DEFAULT_MAX_CHANGE, DEFAULT_TOLERANCE, flip_margin
from prereg.margin_record import load_e0a_noise, noise_label
from prereg.registration import load_registration
from sim2real.replay import replay_run


def run_speed_noise(meta: Mapping[str, Any], root: Path) -> tuple[float | None, str]:
    """The speed noise a replay's margin is judged against: the relative seed spread of the E0a
    summary the run's registration binds, and where it came from (None where there is none)."""
    reg = meta.get("registration")
    if not isinstance(reg, Mapping) or not reg.get("path"):
        return None, "the run is bound to no registration"
    path = Path(str(reg["path"]))
    try:
        r = load_registration(path if path.is_absolute() else root / path, reg.get("sha256"))
    except AgentloadError as exc:
        return None, f"registration unreadable: {exc}"
    found = r.bound_input("e0a")
    if found is None:
        return None, f"registration {r.name} binds no E0a summary"
    try:
        noise = load_e0a_noise(found[0], found[1])
    except (AgentloadError, OSError) as exc:
        return None, f"E0a {found[1]} unreadable: {exc}"
    return noise.get("speed"), f"E0a {found[1]} (relative seed spread of its uncached token rate)"


def replay_margin(
    run_dir: Path,
    cost_file: str | Path | None,
    spec: Mapping[str, Any],
    *,
    base_state: str | None,
    noise: float | None,
    cost_from_meta: bool = False,
    max_change: float = DEFAULT_MAX_CHANGE,
    tol: float = DEFAULT_TOLERANCE,
    scratch: Path | None = None,
) -> dict[str, Any]:
    """The replay's flip margin in speed, each way (None: no change up to max_change flips it), the
    label against `noise`, and the evaluations it took."""
    meta = json.loads((run_dir / "meta.json").read_text())
    token_ref = float((meta.get("references") or {}).get("all_miss_token_rate") or 0.0)

    def state_at(factor: float) -> str:
        tmp = Path(tempfile.mkdtemp(prefix="agentload-replay-margin-", dir=scratch))
        try:
            out = replay_run(
                run_dir, tmp / "run", cost_file=cost_file, cost_from_meta=cost_from_meta, speed_factor=factor
            )
            refs = {"all_miss_token_rate": token_ref * factor} if token_ref > 0 else None
            v = paired_run(spec, run_quantities(out, spec, refs_override=refs, series=False).run)
            return str(v["state"])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    m = flip_margin(state_at, base=base_state, max_change=max_change, tol=tol, probe=noise)
    inside, label = noise_label({"speed": {"faster": m.faster, "slower": m.slower}}, {"speed": noise}, ("speed",))
    return {**m.to_json(), "noise": noise, "inside_noise": [side for _, side in inside], "label": label}
