"""Verify a whole test from its record: every counted run bound and complete, every proof intact,
and the timeline consistent with the labels claimed for the test and its predictions.

Why one command: a reviewer should not have to know which of a dozen files to compare. Each check
prints what holds and what does not; any break makes the exit status non-zero. The checks:

registration  its bytes at the registration commit hash to the SHA-256 the runs and the manifest
              carry; the work-tree copy and every later commit leave those bytes unchanged (a
              registration is never edited after it binds runs); its status is FILLED. An
              exploratory test (no registration binds its runs, or an EXPLORATORY one does) is
              reported as such (`exploratory`), not as a break: it claims no registration
runs          every registered arm x rate x seed has a run; every run in the test directory is
              bound: the registration SHA-256 in its meta.json is this registration's, its plan
              SHA-256 is the registration's plan for that arm x rate x seed and the plan file in
              the run directory has those bytes (it was driven by the frozen plan), its cell
              matches (engine, version, model, GPU, pool within `pool_tolerance_tokens`), it
              COMPLETED, and its code commit is the registration's or a descendant that changes
              nothing under harness/, analysis/, prereg/, slurm/ (AMB-19; committed records there,
              such as later registrations and freeze records, are data and do not count)
proofs        every proof under <testdir>/provenance/proofs/ verifies, and a proof of the
              registration matches every counted run's meta.json
timeline      the label claimed in the manifest is the label the record gives (a test claimed
              pre-registered whose first job was submitted before the registration was confirmed
              on the remote is a break); the blindness claimed in saved score reports is the one
              the record gives; each job's submit <= start <= end; each run lies inside its job
              (within `clock_slack_s`)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harness.recording.schema import RunStatus
from provenance.codepaths import is_code_path
from provenance.git import GitError, Repo
from provenance.meta import sha256_file
from provenance.proofcheck import verify_proof
from review.records import iso
from review.timeline import Timeline, build_timeline, repo_for
from slurm.manifest import never_started, run_meta


@dataclass
class Check:
    area: str
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Verification:
    testdir: Path
    checks: list[Check] = field(default_factory=list)
    timeline: Timeline | None = None
    skipped: list[str] = field(default_factory=list)
    #: Why the test is not registered (no registration binds its runs, or an EXPLORATORY one does):
    #: an exploratory test claims no registration, so its absence is its state, not a break.
    exploratory: str | None = None

    def add(self, area: str, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append(Check(area, name, bool(ok), detail))

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def breaks(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def text(self) -> str:
        verdict = "HOLDS" if self.ok else f"{len(self.breaks)} BREAK(S)"
        if self.exploratory:
            verdict = f"NOT REGISTERED (exploratory: {self.exploratory})" + ("" if self.ok else f"; {verdict}")
        lines = [f"provenance of {self.testdir}: {verdict}"]
        for area in ("registration", "runs", "proofs", "timeline"):
            cs = [c for c in self.checks if c.area == area]
            if not cs:
                continue
            lines.append(f"\n{area}:")
            lines += [
                f"  [{'holds' if c.ok else 'BREAK'}] {c.name}" + (f": {c.detail}" if c.detail else "") for c in cs
            ]
        if self.skipped:
            lines.append("\nnot checked:")
            lines += [f"  [skipped] {x}" for x in self.skipped]
        if self.timeline is not None:
            lines.append(f"\nlabel: {self.timeline.label} ({self.timeline.label_reason})")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "testdir": str(self.testdir),
            "ok": self.ok,
            "checks": [c.__dict__ for c in self.checks],
            "skipped": self.skipped,
            "label": self.timeline.label if self.timeline else None,
            **({"exploratory": self.exploratory} if self.exploratory else {}),
        }


def _cell_diff(run_cell: Mapping[str, Any], reg_cell: Mapping[str, Any], pool_tol: float) -> list[str]:
    out = []

    def g(d: Mapping[str, Any], *ks: str) -> Any:
        cur: Any = d  # a walk into JSON: any value, None where a key is missing
        for k in ks:
            cur = cur.get(k) if isinstance(cur, Mapping) else None
        return cur

    for keys in (("name",), ("engine", "name"), ("engine", "version"), ("model",), ("gpu",)):
        a, b = g(run_cell, *keys), g(reg_cell, *keys)
        if b is not None and a != b:
            out.append(f"{'.'.join(keys)} {a!r} vs registered {b!r}")
    a = g(run_cell, "kv_pool_tokens") or g(run_cell, "pool")
    b = g(reg_cell, "kv_pool_tokens") or g(reg_cell, "pool")
    if b is not None and (a is None or abs(float(a) - float(b)) > pool_tol):
        out.append(f"pool {a} vs registered {b} (tolerance {pool_tol:g})")
    return out


def verify_test(
    testdir: str | Path,
    *,
    repo: Repo | None = None,
    pool_tolerance_tokens: float = 0.0,
    clock_slack_s: float = 60.0,
    code_check: bool = True,
) -> Verification:
    td = Path(testdir)
    v = Verification(td)
    tl = build_timeline(td, repo=repo)
    v.timeline = tl
    facts = tl.registration
    repo = repo_for(td, repo)
    # -- registration -----------------------------------------------------------------------
    ref = facts.ref
    if ref is None:
        v.exploratory = "; ".join(facts.problems) or "no registration binds the runs"
        v.skipped.append(f"registration: not registered (exploratory): {v.exploratory}")
    else:
        v.add(
            "registration",
            f"{ref.path} at {str(ref.commit)[:12]} hashes to the bound SHA-256",
            facts.committed_sha256 == ref.sha256,
            f"committed bytes {str(facts.committed_sha256)[:16]}, bound {ref.sha256[:16]}"
            + ("; " + "; ".join(facts.problems) if facts.problems else ""),
        )
        if facts.worktree_sha256 is not None:
            v.add(
                "registration",
                "work-tree copy unchanged since registration",
                facts.worktree_sha256 == ref.sha256,
                ""
                if facts.worktree_sha256 == ref.sha256
                else f"the file now hashes to {facts.worktree_sha256[:16]}: edited after it bound runs",
            )
        if getattr(repo, "history_known", True):
            v.add(
                "registration",
                "no later commit changed it",
                not facts.later_commits,
                ", ".join(f"{c[:12]} at {t}" for c, t in facts.later_commits),
            )
        else:  # an evidence bundle's proofs hold the commit, not what came after it
            v.skipped.append("registration: later commits not checked (the record holds no history after its commit)")
        st = facts.view.status if facts.view else None
        if st == "EXPLORATORY":
            v.exploratory = f"the registration {ref.path} is EXPLORATORY"
            v.skipped.append(f"registration: status FILLED not required: {v.exploratory}")
        else:
            v.add("registration", "status FILLED", st == "FILLED", f"status {st!r}")
    # -- runs -------------------------------------------------------------------------------
    view = facts.view
    present = {t.run.key: t for t in tl.runs}
    if view is not None and view.arms:
        missing = [k for k in view.registered_runs() if k not in present]
        v.add(
            "runs",
            f"every registered run present ({len(view.registered_runs())})",
            not missing,
            ", ".join(f"{a} r{r} s{s}" for a, r, s in missing),
        )
    for t in tl.runs:
        r = t.run
        name = r.path.name
        bound = (r.registration or {}).get("sha256")
        if ref is not None:
            v.add(
                "runs",
                f"{name} bound to the registration",
                bound == ref.sha256,
                ""
                if bound == ref.sha256
                else f"its meta.json names registration {str(bound)[:16]} ({(r.registration or {}).get('path')})",
            )
        if view is not None and view.arms:
            v.add(
                "runs",
                f"{name} is a registered arm x rate x seed",
                r.key in set(view.registered_runs()),
                f"{r.arm} r{r.rate} s{r.seed}",
            )
        if view is not None and view.plans:
            want = view.plans.get(r.key)
            v.add(
                "runs",
                f"{name} plan hash is the registered one",
                want is not None and r.plan_sha256 == want,
                f"meta.json plan {str(r.plan_sha256)[:16]}, registered {str(want)[:16]}",
            )
        pf = r.path / str((r.meta.get("plan") or {}).get("file") or "plan.parquet")
        if pf.is_file():
            got = sha256_file(pf)
            v.add(
                "runs",
                f"{name} driven by the frozen plan (its plan file's bytes)",
                got == r.plan_sha256,
                ""
                if got == r.plan_sha256
                else f"plan file hashes to {got[:16]}, meta.json says {str(r.plan_sha256)[:16]}",
            )
        else:
            v.add("runs", f"{name} plan file present", False, f"{pf} missing")
        if view is not None and view.cell:
            diff = _cell_diff(r.meta.get("cell") or {}, view.cell, pool_tolerance_tokens)
            v.add("runs", f"{name} cell matches", not diff, "; ".join(diff))
        v.add(
            "runs",
            f"{name} completed",
            r.status == RunStatus.COMPLETED,
            f"status {r.status}" + (f": {r.meta.get('status_reason')}" if r.meta.get("status_reason") else ""),
        )
        if not code_check:
            v.skipped.append(f"{name}: code commit not checked (asked)")
        elif repo is not None and ref is not None and ref.commit:
            v.add("runs", f"{name} code is the registration's", *_code_check(repo, r.meta, ref.commit))
    # -- resubmitted jobs (slurm/resubmit.py): only a job whose run never started may be --------
    for j in (tl.manifest.raw.get("jobs") if tl.manifest else None) or []:
        if not j.get("superseded_by"):
            continue
        ok, why = never_started(run_meta(td / str(j.get("superseded_run_dir") or "")))
        v.add("runs", f"job {j.get('job_id')}, resubmitted as {j['superseded_by']}, never started its run", ok, why)
    # -- proofs -----------------------------------------------------------------------------
    counted_dirs = [t.run.path for t in tl.counted]
    for pd in sorted((td / "provenance" / "proofs").glob("*/proof.json")):
        man = orjson.loads(pd.read_bytes())
        is_reg = ref is not None and man.get("path") == ref.path
        res = verify_proof(pd.parent, run_dirs=[str(d) for d in counted_dirs] if is_reg else None)
        v.add("proofs", f"{pd.parent.name} ({man.get('path')})", res.ok, "; ".join(res.failures))
    # -- timeline ---------------------------------------------------------------------------
    claim = tl.manifest.label if tl.manifest else None
    if claim is not None:
        v.add(
            "timeline",
            f"claimed label {claim!r} is the record's",
            claim == tl.label,
            f"the record gives {tl.label}: {tl.label_reason}",
        )
    for sp in sorted(td.glob("predictions/*score*.json")) + sorted(td.glob("provenance/*score*.json")):
        rep = orjson.loads(sp.read_bytes())
        for f in rep.get("freezes", []):
            fz = next((x for x in tl.freezes if x.tag == f.get("tag")), None)
            if fz is None:
                v.add("timeline", f"{sp.name}: freeze {f.get('tag')} in the record", False, "no freeze record for it")
                continue
            ok = f.get("blindness") == fz.overall.text()
            v.add(
                "timeline",
                f"{sp.name}: {f.get('tag')} claimed {f.get('blindness')!r}",
                ok,
                "" if ok else f"the record gives {fz.overall.text()}: {fz.overall.reason}",
            )
    for t in tl.runs:
        if t.times_from != "scheduler":
            continue
        seq = [x for x in (t.submit, t.start, t.end) if x is not None]
        v.add(
            "timeline",
            f"job {t.job.job_id if t.job else '?'} submit <= start <= end",
            seq == sorted(seq),
            f"{iso(t.submit)} / {iso(t.start)} / {iso(t.end)}",
        )
        rs, re_ = t.run.created_at, t.run.finished_at
        inside = (rs is None or t.start is None or (rs - t.start).total_seconds() >= -clock_slack_s) and (
            re_ is None or t.end is None or (t.end - re_).total_seconds() >= -clock_slack_s
        )
        v.add(
            "timeline",
            f"{t.run.path.name} ran inside its job",
            inside,
            f"run {iso(rs)}..{iso(re_)}, job {iso(t.start)}..{iso(t.end)}",
        )
    rc = facts.remote
    if rc is not None and rc.checked_at is not None and facts.committed_at is not None and rc.contains:
        v.add(
            "timeline",
            "registration committed before it was confirmed on the remote",
            (facts.committed_at - rc.checked_at).total_seconds() <= clock_slack_s,
            f"{iso(facts.committed_at)} vs {iso(rc.checked_at)}",
        )
    return v


def _code_check(repo: Repo, meta: Mapping[str, Any], reg_commit: str) -> tuple[bool, str]:
    git = ((meta.get("provenance") or {}).get("git") or {}) if isinstance(meta.get("provenance"), dict) else {}
    c = git.get("commit")
    if not c:
        return False, "its meta.json records no code commit"
    if git.get("dirty"):
        return False, f"it ran from a dirty checkout of {c[:12]}"
    if c == reg_commit:
        return True, f"commit {c[:12]}"
    try:
        if not repo.is_ancestor(reg_commit, c):
            return False, f"commit {c[:12]} does not descend from the registration's {reg_commit[:12]}"
        changed = [p for p in repo.changed_paths(reg_commit, c) if is_code_path(p)]
    except GitError as exc:
        return False, f"commit {c[:12]} unknown here ({exc})"
    if changed:
        return False, f"commit {c[:12]} changes code since the registration: {', '.join(changed[:5])}"
    return True, f"commit {c[:12]} descends from the registration's and changes no code (recorded as such)"
