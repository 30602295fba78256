"""`agentload evidence check evidence/<test>/`: a registered test's evidence checked from the bundle
alone, with no engine, no cluster and no git.

Why these four checks, and why each reuses the one that already exists:

files     every file hashes to its SHA-256 and size in `bundle.json`, and no file is unlisted:
          nothing below rests on bytes that changed after packing
verdict   the registered verdict recomputed from the bundled records by the one judge
          (`review.registered.registered_analysis`, in process, with the bundled registration's
          frozen rule, references, arms, rates and seeds) equals the bundled verdict on every
          judged field (`judged_fields`: the verdict with the machine's paths reduced to run names)
proofs    `review.verify.verify_test` on the bundle's test directory, its git questions answered by
          `provenance.proofrepo.ProofRepo` from the proofs' raw objects (each re-identified by its
          hash; `provenance.proofcheck` verifies every proof): the registration's bytes at its
          commit, every run bound to it, its plan and code; then the bindings a reviewer needs:
          the registration proof's bytes are the bundled copy and the hash every run's meta.json
          carries, each frozen prediction's proof is at the freeze record's tag and commit and
          holds the bundled copy's bytes, and the prediction names that registration
timeline  from the records' own times (git's committer time in the proven commit object, the
          remote check in the manifest, the freeze record's confirmation, the scheduler's
          accounting and each run's meta.json): the registration committed and on the remote and
          every freeze confirmed before the first run started; the label and each freeze's
          blindness as the record gives them

Each check prints holds / BREAK with the reason; the exit status is non-zero on any break.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import yaml

from harness.errors import ConfigError
from provenance.meta import sha256_file
from provenance.proofcheck import verify_proof
from provenance.proofrepo import ProofRepo
from review.evidence import FORMAT, MANIFEST, REPO, TEST, EvidenceError
from review.records import iso
from review.registered import RegisteredAnalysisError, registered_analysis
from review.verify import Verification, verify_test

AREAS = ("files", "verdict", "proofs", "timeline")
#: Keys whose values are where a file lay on the machine that judged, not what was judged.
_PATH_KEYS = {"run_dir", "path", "out", "dir", "runs_dir"}


@dataclass
class EvidenceCheck:
    bundle: Path
    checks: list[tuple[str, str, bool, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)  # what the record gives (labels), stated, not judged
    verification: Verification | None = None

    def add(self, area: str, name: str, ok: bool, detail: str = "") -> bool:
        self.checks.append((area, name, bool(ok), detail))
        return bool(ok)

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c[2] for c in self.checks)

    @property
    def breaks(self) -> list[tuple[str, str, bool, str]]:
        return [c for c in self.checks if not c[2]]

    def text(self) -> str:
        head = "HOLDS" if self.ok else f"{len(self.breaks)} BREAK(S)"
        lines = [f"evidence bundle {self.bundle}: {head}"]
        for area in AREAS:
            cs = [c for c in self.checks if c[0] == area]
            if cs:
                lines.append(f"\n{area}:")
                lines += [f"  [{'holds' if ok else 'BREAK'}] {n}" + (f": {d}" if d else "") for _, n, ok, d in cs]
        if self.facts:
            lines.append("\nthe record gives:")
            lines += [f"  {x}" for x in self.facts]
        if self.notes:
            lines.append("\nnot checked:")
            lines += [f"  [skipped] {n}" for n in self.notes]
        return "\n".join(lines)


def judged_fields(verdict: dict[str, Any]) -> dict[str, Any]:
    """What a verdict judged, apart from where its files lay: the verdict without the registered
    block's bookkeeping (who judged, when, the paths), every path reduced to its last part."""

    def strip(x: Any, key: str = "") -> Any:
        if isinstance(x, dict):
            return {k: strip(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [strip(v, key) for v in x]
        if isinstance(x, str) and key in _PATH_KEYS:
            return Path(x).name
        return x

    plain = {k: v for k, v in verdict.items() if k != "registered"}
    reg = verdict.get("registered") or {}
    kept = {k: reg.get(k) for k in ("rule", "family", "references", "kill_conditions", "any_kill_triggered")}
    kept["runs_counted"] = sorted(Path(str(r)).name for r in reg.get("runs_counted") or [])
    kept["runs_excluded"] = sorted(Path(str(r.get("run_dir"))).name for r in reg.get("runs_excluded") or [])
    out: dict[str, Any] = strip({**plain, "registered": kept})
    return out


def _diff(a: Any, b: Any, where: str = "") -> list[str]:
    """Where the recomputed verdict `b` differs from the bundled `a`, for a reason a reader can act
    on. Every field of the bundled verdict must be recomputed to the same value; a field the judge
    has added since (in `b` only) is not one the bundle judged, and is not compared."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(a, key=str):
            out += _diff(a.get(k), b.get(k), f"{where}.{k}" if where else str(k))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _diff(x, y, f"{where}[{i}]")]
    if _same_float(a, b):
        return []
    return [] if a == b else [f"{where}: bundled {a!r:.80}, recomputed {b!r:.80}"]


#: How far a recomputed statistic may sit from the bundled one and still be the same number. A
#: reviewer's numpy (its version, the SIMD path its CPU takes) may sum in another order, so a
#: least-squares slope recomputed from the very same records moved in its last digit (1 unit in
#: 2^52) between two machines of one kind; states, outcomes, counts and strings stay exact.
FLOAT_RTOL = 1e-12


def _same_float(a: Any, b: Any) -> bool:
    """Both floats (not bools, not ints: counts stay exact) within FLOAT_RTOL of each other."""
    if not (isinstance(a, float) and isinstance(b, float)):
        return False
    return math.isclose(a, b, rel_tol=FLOAT_RTOL, abs_tol=0.0) or (math.isnan(a) and math.isnan(b))


def _manifest(bundle: Path) -> dict[str, Any]:
    p = bundle / MANIFEST
    try:
        doc = orjson.loads(p.read_bytes())
    except OSError:
        raise EvidenceError(f"{p}: no bundle manifest; expected a folder `agentload evidence pack` wrote") from None
    except orjson.JSONDecodeError as exc:
        raise EvidenceError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise EvidenceError(f"{p}: format: got {got!r}; expected {FORMAT!r}")
    for k in ("files", "registration"):
        if k not in doc:
            raise EvidenceError(f"{p}: {k}: missing from the bundle manifest")
    return doc


def check_files(bundle: Path, doc: dict[str, Any], res: EvidenceCheck) -> None:
    listed = {str(f["path"]): f for f in doc["files"]}
    for rel, f in listed.items():
        p = bundle / rel
        if not p.is_file():
            res.add("files", rel, False, "listed in bundle.json, not in the bundle")
            continue
        got, size = sha256_file(p), p.stat().st_size
        if got != f.get("sha256") or size != f.get("size"):
            res.add(
                "files",
                rel,
                False,
                f"{size} bytes hashing to {got[:16]}; bundle.json: {f.get('size')} bytes, {str(f.get('sha256'))[:16]}",
            )
    bad = sum(1 for c in res.checks if c[0] == "files")
    res.add("files", f"{len(listed) - bad} of {len(listed)} listed files hash to their SHA-256 and size", not bad)
    extra = sorted(
        p.relative_to(bundle).as_posix()
        for p in bundle.rglob("*")
        if p.is_file()
        and p.name != MANIFEST
        and "__pycache__" not in p.parts
        and p.relative_to(bundle).as_posix() not in listed
    )
    res.add("files", "no file outside bundle.json", not extra, ", ".join(extra[:5]))


def check_verdict(bundle: Path, doc: dict[str, Any], res: EvidenceCheck) -> None:
    reg = bundle / REPO / str(doc["registration"]["path"])
    vpath = bundle / str(doc.get("verdict") or f"{TEST}/analysis/registered-verdict.json")
    try:
        bundled = orjson.loads(vpath.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        res.add("verdict", "bundled registered verdict readable", False, f"{vpath}: {exc}")
        return
    with tempfile.TemporaryDirectory(prefix="agentload-evidence-") as tmp:
        try:
            again = registered_analysis(reg, [bundle / TEST / "runs"], Path(tmp), git=False)
        except (RegisteredAnalysisError, ConfigError, OSError) as exc:
            res.add("verdict", "registered verdict recomputed from the bundled records", False, str(exc))
            return
    a, b = judged_fields(bundled), judged_fields(again)
    diffs = _diff(a, b)
    res.add(
        "verdict",
        f"recomputed verdict {again.get('verdict')} equals the bundled {bundled.get('verdict')} on every judged field",
        not diffs,
        "; ".join(diffs[:4]) + (f" (and {len(diffs) - 4} more)" if len(diffs) > 4 else ""),
    )
    counted = len((again.get("registered") or {}).get("runs_counted") or [])
    res.add(
        "verdict",
        f"{counted} bundled run(s) judged, {len(bundled['registered']['runs_counted'])} bundled as counted",
        bool(counted) and counted == len(bundled["registered"]["runs_counted"]),
    )


def check_proofs(bundle: Path, doc: dict[str, Any], res: EvidenceCheck) -> None:
    test = bundle / TEST
    proof_dirs = sorted(p.parent for p in (test / "provenance" / "proofs").glob("*/proof.json"))
    repo = ProofRepo(bundle / REPO, proof_dirs)
    for r in repo.rejected:
        res.add("proofs", "proof objects re-identified by their hash", False, r)
    v = verify_test(test, repo=repo)
    res.verification = v
    for c in v.checks:
        res.add("proofs" if c.area != "timeline" else "timeline", f"{c.area}: {c.name}", c.ok, c.detail)
    res.notes += v.skipped
    ref = doc["registration"]
    reg_copy = bundle / REPO / str(ref["path"])
    reg_proofs = [
        d for d in proof_dirs if _proof(d).get("path") == ref["path"] and _proof(d).get("commit") == ref["commit"]
    ]
    runs = sorted(p.parent for p in (test / "runs").glob("*/meta.json"))
    if res.add(
        "proofs",
        f"a proof of {ref['path']} at its commit {str(ref['commit'])[:12]}",
        bool(reg_proofs),
        "" if reg_proofs else "none in the bundle",
    ):
        pr = verify_proof(reg_proofs[0], reg_copy, [str(d) for d in runs])
        res.add(
            "proofs",
            f"the registration's proven bytes: the bundled copy's, the SHA-256 all {len(runs)} runs' meta.json carry",
            pr.ok and _proof(reg_proofs[0]).get("file_sha256") == ref["sha256"],
            "; ".join(pr.failures)
            or f"proof hash {str(_proof(reg_proofs[0]).get('file_sha256'))[:16]}, bundle.json {ref['sha256'][:16]}",
        )
    freezes = doc.get("freezes") or []
    if not freezes:
        res.notes.append("predictions: none was frozen for this test; no blindness to check")
    for fz in freezes:
        rec_path = test / "provenance" / "freezes" / f"{fz['tag']}.json"
        try:
            rec = orjson.loads(rec_path.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            res.add("proofs", f"freeze record {fz['tag']}", False, f"{rec_path}: {exc}")
            continue
        for f in rec.get("files") or []:
            path = str(f.get("path"))
            proofs = [
                d
                for d in proof_dirs
                if _proof(d).get("path") == path and (_proof(d).get("tag") or {}).get("name") == fz["tag"]
            ]
            if not res.add(
                "proofs", f"a proof of {path} at tag {fz['tag']}", bool(proofs), "" if proofs else "none in the bundle"
            ):
                continue
            man = _proof(proofs[0])
            pr = verify_proof(proofs[0], bundle / REPO / path)
            res.add(
                "proofs",
                f"{path}: proven at the freeze record's tag and commit, the bundled copy's bytes",
                pr.ok
                and man.get("commit") == rec.get("commit")
                and (man.get("tag") or {}).get("id") == rec.get("tag_object")
                and man.get("file_sha256") == f.get("sha256"),
                "; ".join(pr.failures)
                or f"proof commit {str(man.get('commit'))[:12]} / tag object "
                f"{str((man.get('tag') or {}).get('id'))[:12]}, "
                f"record {str(rec.get('commit'))[:12]} / {str(rec.get('tag_object'))[:12]}",
            )
            if f.get("kind") == "predictions":
                names = _prediction_registration(bundle / REPO / path)
                res.add(
                    "proofs",
                    f"{path} predicts this registration (the SHA-256 the runs carry)",
                    names == ref["sha256"],
                    f"the file names registration {str(names)[:16]}, the runs {ref['sha256'][:16]}",
                )


def _proof(d: Path) -> dict[str, Any]:
    try:
        man = orjson.loads((d / "proof.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return man if isinstance(man, dict) else {}


def _prediction_registration(path: Path) -> str | None:
    try:
        doc = yaml.safe_load(path.read_bytes())
    except (OSError, yaml.YAMLError):
        return None
    reg = doc.get("registration") if isinstance(doc, dict) else None
    return str(reg.get("sha256")) if isinstance(reg, dict) and reg.get("sha256") else None


def check_timeline(res: EvidenceCheck) -> None:
    v = res.verification
    tl = v.timeline if v is not None else None
    if tl is None:
        res.add("timeline", "a timeline from the bundle's records", False, "the verification built none")
        return
    counted = tl.counted
    starts = [t.start for t in counted if t.start is not None] + [t.run.created_at for t in counted if t.run.created_at]
    first: datetime | None = min(starts) if starts else None
    if not res.add(
        "timeline",
        "first counted run start known",
        first is not None,
        f"{iso(first)}" if first is not None else f"{len(counted)} counted run(s), none with a start time",
    ):
        return
    assert first is not None
    src = "scheduler accounting and meta.json" if any(t.times_from == "scheduler" for t in counted) else "meta.json"
    facts = tl.registration
    c = facts.committed_at
    res.add(
        "timeline",
        "registration committed before the first run start",
        c is not None and c < first,
        f"committed {iso(c)} (proven commit object's committer time), first start {iso(first)} ({src})",
    )
    rc = facts.remote
    on_remote = rc.checked_at if rc is not None and rc.contains else None
    res.add(
        "timeline",
        "registration on the remote before the first run start",
        on_remote is not None and on_remote <= first,
        f"remote check {iso(on_remote)} (submission manifest), first start {iso(first)}",
    )
    for f in tl.freezes:
        res.add(
            "timeline",
            f"freeze {f.tag} confirmed on the remote before the first run start",
            f.confirmed_at is not None and f.confirmed_at < first,
            f"confirmed {iso(f.confirmed_at)} (freeze record), first start {iso(first)}; blindness: {f.overall.text()}",
        )
    claimed = ((tl.manifest.raw.get("label_at_submission") or {}) if tl.manifest else {}).get("label")
    if claimed is not None:  # what `submit` computed and printed before the first job
        res.add(
            "timeline",
            f"label claimed at submission {claimed!r} is the record's",
            claimed == tl.label,
            f"the record gives {tl.label}: {tl.label_reason}",
        )
    res.facts.append(f"label: {tl.label} ({tl.label_reason})")
    for f in tl.freezes:
        res.facts.append(f"predictions {f.tag}: {f.overall.text()} ({f.overall.reason})")


def check_bundle(bundle: str | Path) -> EvidenceCheck:
    """Every check of the module doc, in order; a break in one does not stop the others."""
    b = Path(bundle)
    if not b.is_dir():
        raise EvidenceError(f"{b}: no such evidence bundle (a folder `agentload evidence pack` wrote)")
    doc = _manifest(b)
    res = EvidenceCheck(b)
    check_files(b, doc, res)
    check_verdict(b, doc, res)
    check_proofs(b, doc, res)
    check_timeline(res)
    return res
