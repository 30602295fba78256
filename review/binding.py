"""Whether a run is bound to a registration: the one test that both the registered analysis
(review/registered.py, which counts only bound runs) and `status` (review/status.py, which lists
how many are) apply to a run directory.

Why a module of its own: the registered analysis judges, so it imports the estimators (numpy,
pandas, pyarrow); `status` only binds, and reads no table of any run, so it imports this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.recording.schema import RunStatus, read_meta
from provenance.codepaths import is_code_path


@dataclass
class Binding:
    run_dir: str
    bound: bool
    reasons: list[str]
    arm: str | None = None
    rate: float | None = None
    seed: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "run_dir": self.run_dir,
            "bound": self.bound,
            "reasons": self.reasons,
            "arm": self.arm,
            "rate": self.rate,
            "seed": self.seed,
        }


def bind_run(
    run_dir: str | Path,
    reg: Any,
    repo: Any = None,
    reg_commit: str | None = None,
    *,
    pool_tolerance_tokens: int = 0,
    check_code: bool = True,
) -> Binding:
    """Is this run bound to the registration? Every failed condition is a reason."""
    d = Path(run_dir)
    m = read_meta(d)
    if m is None:
        return Binding(str(d), False, ["no readable meta.json"])
    reasons: list[str] = []
    arm, rate, seed = m.get("arm"), m.get("rate"), m.get("seed")
    rb = m.get("registration")
    if not isinstance(rb, dict) or rb.get("sha256") != reg.sha256:
        got = rb.get("sha256") if isinstance(rb, dict) else rb
        reasons.append(f"registration SHA-256 {got!r} is not this registration's {reg.sha256}")
    want_plan = (
        reg.plan_sha256(str(arm), float(rate), int(seed))
        if arm is not None and rate is not None and seed is not None
        else None
    )
    got_plan = (m.get("plan") or {}).get("sha256")
    if want_plan is None:
        reasons.append(f"({arm}, {rate}, {seed}) is not a registered arm x rate x seed")
    elif got_plan != want_plan:
        reasons.append(f"plan SHA-256 {got_plan} is not the registered {want_plan}")
    cell = m.get("cell") or {}
    rc = reg.cell
    eng = cell.get("engine") or {}
    for label, got, want in (
        ("engine", eng.get("name"), rc.engine.name),
        ("engine version", eng.get("version"), rc.engine.version),
        ("model", cell.get("model"), rc.model),
        ("GPU", cell.get("gpu"), rc.gpu),
        ("cell", cell.get("name"), rc.name),
    ):
        if got != want:
            reasons.append(f"{label} {got!r} is not the registered {want!r}")
    pool = cell.get("kv_pool_tokens")
    if not isinstance(pool, int) or abs(pool - rc.kv_pool_tokens) > pool_tolerance_tokens:
        reasons.append(
            f"KV pool {pool!r} tokens is not the registered {rc.kv_pool_tokens} (tolerance {pool_tolerance_tokens})"
        )
    if check_code:
        g = ((m.get("provenance") or {}).get("git")) or {}
        commit = g.get("commit")
        if g.get("dirty"):
            reasons.append("ran from a checkout with uncommitted code changes")
        if commit is None:
            reasons.append("no code commit recorded")
        elif repo is None or reg_commit is None:
            reasons.append("the registration's commit is unknown, so the run's code commit cannot be checked")
        elif commit != reg_commit:
            if not repo.ok("cat-file", "-e", f"{commit}^{{commit}}"):
                reasons.append(f"code commit {commit[:12]} is not in this repository")
            elif not repo.is_ancestor(reg_commit, commit):
                reasons.append(
                    f"code commit {commit[:12]} does not descend from the registration's commit {reg_commit[:12]}"
                )
            else:
                changed = [p for p in repo.changed_paths(reg_commit, commit) if is_code_path(p)]
                if changed:
                    reasons.append(
                        f"code commit {commit[:12]} changes code since the registration's commit: {changed[:3]}"
                    )
    status = m.get("status")
    if status != RunStatus.COMPLETED:
        reasons.append(f"status {status!r}: only a completed run counts")
    return Binding(str(d), not reasons, reasons, arm, rate, seed)
