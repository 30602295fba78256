"""May this registration drive jobs now, and what label would their runs carry?

`check_registration(path)` answers from the file and from git alone (nobody's word): the file's
SHA-256 and status; every input's bytes against the registered hash and against the copy committed
with the registration; whether the registration is committed in a clean tree, in which commit, and
whether the remote branch holds that commit (asked of the remote); every frozen plan regenerated
from the registration's own configs and hashed; and the label jobs submitted now would get. Each
refusal names what is wrong. The submission command and the job script call this; `agentload
prereg check` prints it.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prereg.filling import plan_hashes
from prereg.labels import GitFacts, Label, git_facts, label_for, label_now
from prereg.registration import Registration, load_registration
from provenance.git import GitError, Repo


@dataclass
class InputCheck:
    path: str
    registered_sha256: str
    present: bool
    current_sha256: str | None
    committed_sha256: str | None  # the bytes committed at the registration's commit
    ok: bool
    problem: str | None


@dataclass
class CheckResult:
    path: str
    name: str
    sha256: str
    status: str
    expect_sha256: str | None
    git: dict[str, Any] | None
    label: dict[str, Any]
    inputs: list[InputCheck] = field(default_factory=list)
    plans: dict[str, Any] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.refusals

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_plans(reg: Registration) -> dict[str, Any]:
    """Regenerate every registered plan from the registration's own configs and compare hashes."""
    if not reg.plans:
        return {"checked": 0, "mismatches": []}
    arms = {a: reg.arm_configs[a] for a in reg.arms if a in reg.arm_configs}
    missing = [a for a in reg.arms if a not in reg.arm_configs]
    if missing:
        return {
            "checked": 0,
            "mismatches": [],
            "error": f"arm_configs lacks {missing}: the plans cannot be regenerated",
        }
    now = plan_hashes(
        reg.workload, reg.protocol, arms, reg.multiples(), reg.references.lambda_ref, list(reg.seeds), reg.top_rate
    )
    have = {(p.arm, p.rate, p.seed): p.sha256 for p in reg.plans}
    bad = []
    for p in now:
        want = have.get((p["arm"], p["rate"], p["seed"]))
        if want != p["sha256"]:
            bad.append(
                {"arm": p["arm"], "rate": p["rate"], "seed": p["seed"], "registered": want, "generated": p["sha256"]}
            )
    return {"checked": len(now), "mismatches": bad}


def check_registration(
    path: str | Path,
    *,
    expect_sha256: str | None = None,
    remote: str | None = None,
    branch: str | None = None,
    plans: bool = True,
    allow_exploratory: bool = False,
) -> CheckResult:
    """Every check of the module docstring; `refusals` is empty iff jobs may be submitted now."""
    p = Path(path)
    reg = load_registration(p)
    refusals: list[str] = []
    if expect_sha256 is not None and reg.sha256 != expect_sha256.lower():
        refusals.append(
            f"hash: the file's SHA-256 is {reg.sha256}; expected {expect_sha256.lower()} (not the registered file)"
        )
    if reg.status != "FILLED" and not (allow_exploratory and reg.status == "EXPLORATORY"):
        why = f" ({'; '.join(reg.status_reasons)})" if reg.status_reasons else ""
        refusals.append(f"status: {reg.status}{why}; expected FILLED (only a FILLED registration binds a test)")

    facts: GitFacts | None = None
    repo = None
    try:
        repo = Repo.containing(p)
        facts = git_facts(p, remote, branch)
    except GitError as exc:
        refusals.append(f"git: {p} is not in a git working tree ({exc}); a registration must be committed")
    if facts is not None:
        if facts.state == "untracked":
            refusals.append(f"commit: {facts.path} is not committed; commit it (and push) before submitting")
        elif facts.state == "modified":
            refusals.append(
                f"commit: {facts.path} differs from its last commit {facts.commit}; commit the change or restore the "
                "file"
            )
        if not facts.clean:
            refusals.append(
                "tree: the working tree has uncommitted changes to tracked files; jobs must run from a clean checkout"
            )
        # an unreachable remote is not a refusal: the label then cannot be pre-registered, and says so

    inputs: list[InputCheck] = []
    reg_commit = facts.commit if facts is not None and facts.state == "committed" else None
    for inp in reg.inputs:
        ic = _check_input(inp.path, inp.sha256, repo, reg_commit)
        inputs.append(ic)
        if not ic.ok:
            refusals.append(f"input {inp.path}: {ic.problem}")

    plan_report: dict[str, Any] = {"checked": 0, "mismatches": [], "skipped": not plans}
    if plans and reg.status in ("FILLED", "EXPLORATORY"):
        plan_report = {**check_plans(reg), "skipped": False}
        for m in plan_report["mismatches"]:
            refusals.append(
                f"plan {m['arm']} x {m['rate']} seed {m['seed']}: registered SHA-256 {m['registered']}, the configs "
                f"now generate {m['generated']}"
            )
        if plan_report.get("error"):
            refusals.append(f"plans: {plan_report['error']}")

    if facts is not None:
        lab, _ = label_now(p, reg.status, facts=facts)
    else:
        lab = label_for(
            status=reg.status,
            committed=False,
            clean=False,
            commit_time=None,
            remote_confirmed_at=None,
            first_submit=None,
        )
    return CheckResult(
        str(p),
        reg.name,
        reg.sha256,
        reg.status,
        expect_sha256,
        facts.to_json() if facts else None,
        _label_json(lab),
        inputs,
        plan_report,
        refusals,
    )


def _label_json(lab: Label) -> dict[str, Any]:
    return lab.to_json()


def _check_input(rel: str, want: str, repo: Any, commit: str | None) -> InputCheck:
    root = repo.path if repo is not None else Path.cwd()
    fp = Path(rel) if Path(rel).is_absolute() else root / rel
    if not fp.is_file():
        return InputCheck(
            rel, want, False, None, None, False, "missing: the registered input copy is not in the checkout"
        )
    cur = _sha(fp.read_bytes())
    committed = None
    if repo is not None and commit is not None:
        try:
            committed = _sha(repo.blob_at(commit, repo.relpath(fp)))
        except (GitError, ValueError):
            committed = None
    if cur != want:
        return InputCheck(
            rel, want, True, cur, committed, False, f"changed since it was registered: SHA-256 {cur}, registered {want}"
        )
    if repo is not None and commit is not None and committed is None:
        return InputCheck(
            rel,
            want,
            True,
            cur,
            None,
            False,
            f"not committed at the registration's commit {commit[:12]}: commit the inputs with the registration",
        )
    if committed is not None and committed != want:
        return InputCheck(
            rel,
            want,
            True,
            cur,
            committed,
            False,
            f"the copy committed at {commit[:12] if commit else '?'} has SHA-256 {committed}, registered {want}",
        )
    return InputCheck(rel, want, True, cur, committed, True, None)


def format_check(res: CheckResult) -> str:
    """The check as a person reads it."""
    lines = [
        f"registration {res.name}: {res.path}",
        f"  sha256   {res.sha256}" + (f" (expected {res.expect_sha256})" if res.expect_sha256 else ""),
        f"  status   {res.status}",
    ]
    g = res.git
    if g:
        lines.append(
            f"  git      {g['state']} in {g['commit'] or '-'}; tree {'clean' if g['clean'] else 'DIRTY'}; "
            f"{g['remote'] or '?'}/{g['branch'] or '?'} {'contains it' if g['on_remote'] else 'does NOT contain it'}"
            + (f" (asked {g['checked_at']})" if g.get("checked_at") else "")
        )
        if g.get("remote_error"):
            lines.append(f"  remote   could not be asked: {g['remote_error']}")
    for i in res.inputs:
        lines.append(f"  input    {'ok ' if i.ok else 'BAD'} {i.path}" + (f": {i.problem}" if i.problem else ""))
    pl = res.plans
    if pl.get("skipped"):
        lines.append("  plans    not checked")
    else:
        lines.append(f"  plans    {pl.get('checked', 0)} regenerated, {len(pl.get('mismatches', []))} mismatched")
    lab = res.label
    lines.append(f"  label    {lab['label']} if jobs were submitted now: {lab['reason']}")
    if res.refusals:
        lines.append("REFUSED:")
        lines += [f"  - {r}" for r in res.refusals]
    else:
        lines.append("OK: jobs may be submitted under this registration")
    return "\n".join(lines)
