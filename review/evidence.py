"""`agentload evidence pack TESTDIR --out evidence/<test>/`: a registered test's evidence, for the
repository.

Why a bundle: the runs of a registered test live in its test directory on the machine that ran
it, and its registration commit and freeze tag live in the repository it was registered in (tags
are not always cloned; a fixture or team repository may never be public). A reviewer who clones
the project must still be able to recompute the registered verdict and check its provenance. The
bundle copies exactly what those depend on, each file with its SHA-256 in `bundle.json`:

  repo/<path>                         the registration's bytes at its commit, and each frozen
                                      prediction file's bytes at its tag, at their repository paths
  test/submission.json                the submission manifest (registration, remote check, jobs)
  test/collection.json                what `jobs collect` found
  test/provenance/accounting.{json,csv}  the scheduler's accounting export (local-jobs.json for jobs
                                      the local executor ran: no scheduler, no export)
  test/provenance/freezes/<tag>.json  the freeze records
  test/provenance/proofs/<name>/      raw git objects (`provenance prove`): the registration at
                                      its commit (and at each run's code commit), each frozen
                                      file at its tag
  test/runs/<run>/                    meta.json, the compacted record tables (Parquet) meta.json
                                      lists, and the frozen plan the run played (its bytes are
                                      what `provenance verify` compares with the registered hash;
                                      a plan of the small protocols bundled is a few KB)
  test/superseded/<run>.job-<id>/     the run of a job resubmitted because it never started (its
                                      meta.json says why; `provenance verify` checks it sent nothing)
  test/analysis/                      the registered verdict (registered-verdict.json, the reports)
  test/predictions/                   the scored predictions

Left out: the append-only JSONL (the Parquet tables are its compaction, hashed in meta.json),
server and job logs, figures. `review.evidence_check` checks a bundle with no engine, no cluster
and no git.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harness.errors import RecordError, UsageError
from harness.recording.schema import SUPERSEDED_DIR
from provenance.git import GitError, Repo, utc_now
from provenance.meta import sha256_bytes, sha256_file
from provenance.portable import portable_argv
from provenance.proofs import prove
from review.records import read_manifest, read_run, registration_view
from review.testdir import find_verdicts
from review.timeline import discover_freezes, repo_for

FORMAT = "agentload-evidence"
MANIFEST = "bundle.json"
README = "README.md"
TEST, REPO = "test", "repo"
#: What a bundle may weigh before `pack` warns, and what all of a repository's bundles may (the
#: issue's allowance is about 30 MB in all).
BUNDLE_BUDGET_BYTES = 10 << 20
ALL_BUDGET_BYTES = 30 << 20
_TEST_FILES = (
    "submission.json",
    "collection.json",
    "provenance/accounting.json",
    "provenance/accounting.csv",
    "provenance/local-jobs.json",
)


class EvidenceError(UsageError):
    """A bundle cannot be packed or read as asked (the message says what, where, and what to do)."""


@dataclass
class Packed:
    """What `pack` wrote: the bundle folder, its files' total size, and the warnings."""

    out: Path
    files: list[dict[str, Any]]
    total_bytes: int
    warnings: list[str] = field(default_factory=list)

    def text(self) -> str:
        lines = [f"evidence bundle {self.out}: {len(self.files)} files, {self.total_bytes / 1e6:.2f} MB"]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def _need(missing: list[str], ok: bool, what: str) -> bool:
    if not ok:
        missing.append(what)
    return ok


def _run_files(run: Path, missing: list[str]) -> list[Path]:
    """meta.json, the Parquet tables meta.json lists and the plan file of one run directory."""
    rec = read_run(run)
    tables = rec.meta.get("tables")
    out = [run / "meta.json"]
    if not isinstance(tables, dict) or not tables:
        missing.append(
            f"{run}: its records are not compacted to Parquet (meta.json `tables` is {tables!r}); a run that ended "
            "compacts them itself, so an unfinished run cannot be packed: wait for it, or collect the jobs first"
        )
        return out
    for name, t in sorted(tables.items()):
        f = run / str(t.get("file") or "")
        if _need(missing, f.is_file(), f"{run}: the {name} table {f.name} that meta.json lists is not there"):
            if sha256_file(f) != t.get("sha256"):
                missing.append(f"{f}: its bytes do not hash to meta.json's {str(t.get('sha256'))[:16]}: not the record")
            out.append(f)
    plan = run / str((rec.meta.get("plan") or {}).get("file") or "plan.parquet")
    if _need(missing, plan.is_file(), f"{run}: the frozen plan {plan.name} the run played is not there"):
        out.append(plan)
    return out


def pack(
    testdir: str | Path,
    out: str | Path,
    *,
    repo: Repo | None = None,
    note: str | None = None,
    budget_bytes: int = BUNDLE_BUDGET_BYTES,
) -> Packed:
    """Copy what a registered test's verdict and provenance depend on into `out`; see the module doc."""
    td = Path(testdir).resolve()
    if not td.is_dir():
        raise EvidenceError(f"{td}: no such test directory")
    dest = Path(out)
    if dest.exists() and any(dest.iterdir()):
        raise EvidenceError(f"{dest}: not empty; a bundle is packed into a new folder (remove it to re-pack)")
    missing: list[str] = []
    manifest = read_manifest(td)
    _need(
        missing,
        manifest is not None,
        f"the submission manifest {td / 'submission.json'} (written by `agentload submit`)",
    )
    # the scheduler's accounting export; jobs the local executor ran have its own record instead
    local = manifest is not None and manifest.raw.get("executor") == "local"
    for rel in ("collection.json", "provenance/local-jobs.json" if local else "provenance/accounting.json"):
        _need(missing, (td / rel).is_file(), f"{td / rel} (written by `agentload jobs collect`)")
    run_dirs = sorted({p.parent for p in (td / "runs").glob("*/meta.json")})
    _need(missing, bool(run_dirs), f"run directories under {td / 'runs'} (gathered by `agentload jobs collect`)")
    run_files = {d: _run_files(d, missing) for d in run_dirs}
    # the runs of resubmitted jobs (slurm/resubmit.py), kept so that a reviewer sees they never started
    superseded = {
        d: _run_files(d, missing) for d in sorted({p.parent for p in (td / SUPERSEDED_DIR).glob("*/meta.json")})
    }
    verdicts = [p for p in find_verdicts(td) if p.name == "registered-verdict.json"]
    _need(
        missing,
        bool(verdicts),
        f"a registered verdict (registered-verdict.json) in {td} or below it: run `agentload analyze --registration "
        f"REG {td / 'runs'} --out {td / 'analysis'}` (or `jobs collect` without --no-analysis)",
    )
    git = repo_for(td, repo)
    if git is None:
        missing.append(
            f"a git repository holding {td} or the current folder: run `evidence pack` inside the repository the test "
            "was registered in (or pass --repo), which holds its registration commit and freeze tags"
        )
    if manifest is None or git is None:
        raise EvidenceError(f"cannot pack {td}: missing\n  - " + "\n  - ".join(missing))
    ref = manifest.registration
    reg_bytes = None
    if _need(
        missing, ref.commit is not None, f"{td / 'submission.json'}: registration.commit (the manifest names none)"
    ):
        try:
            reg_bytes = git.blob_at(str(ref.commit), ref.path)
        except GitError:
            missing.append(
                f"{ref.path} at commit {str(ref.commit)[:12]} in {git.path}: pack inside the repository the test was "
                "registered in (or pass --repo)"
            )
    if reg_bytes is not None and sha256_bytes(reg_bytes) != ref.sha256:
        missing.append(
            f"{ref.path} at {str(ref.commit)[:12]} hashes to {sha256_bytes(reg_bytes)[:16]}, not {ref.sha256}"
        )
    test = manifest.test
    if reg_bytes is not None:
        try:
            test = test or registration_view(reg_bytes, f"{str(ref.commit)[:12]}:{ref.path}").test
        except RecordError as exc:
            missing.append(str(exc))
    freezes = discover_freezes(td, git, test or "")  # "" matches no other test's freeze in the repository
    for fz in freezes:
        if git.local_tag(fz.tag) is None:
            missing.append(f"the freeze tag {fz.tag} in {git.path} (fetch it: git fetch origin tag {fz.tag})")
    if missing:
        raise EvidenceError(f"cannot pack {td}: missing\n  - " + "\n  - ".join(missing))
    assert reg_bytes is not None and ref.commit is not None

    dest.mkdir(parents=True, exist_ok=True)
    tdest, rdest = dest / TEST, dest / REPO
    _write(rdest / ref.path, reg_bytes)
    proofs = tdest / "provenance" / "proofs"
    remote = manifest.raw.get("remote_check") or manifest.raw.get("remote")
    prove(git.path / ref.path, proofs / f"registration-{ref.commit[:12]}", commit=ref.commit, repo=git, remote=remote)
    code_commits = {
        str(c)
        for d in run_dirs
        if (c := ((read_run(d).meta.get("provenance") or {}).get("git") or {}).get("commit")) and c != ref.commit
    }
    for c in sorted(code_commits):  # the runs' code commit's objects, for checking it descends and changes no code
        try:
            prove(git.path / ref.path, proofs / f"registration-at-code-{c[:12]}", commit=c, repo=git)
        except (GitError, UsageError) as exc:
            print(f"note: no proof of the registration at the runs' code commit {c[:12]}: {exc}", file=sys.stderr)
    frozen = []
    for fz in freezes:
        src = fz.path if fz.path is not None else None
        if src is not None:
            _write(tdest / "provenance" / "freezes" / f"{fz.tag}.json", src.read_bytes())
        for f in fz.files:
            path = str(f["path"])
            _write(rdest / path, git.blob_at(fz.commit, path))
            prove(
                git.path / path,
                proofs / f"{Path(path).stem}-{fz.tag}",
                tag=fz.tag,
                repo=git,
                remote=fz.data.get("remote"),
            )
        frozen.append({"tag": fz.tag, "commit": fz.commit, "files": [f["path"] for f in fz.files]})
    for rel in _TEST_FILES:
        if (td / rel).is_file():
            _write(tdest / rel, (td / rel).read_bytes())
    for d, kept in run_files.items():
        for src_file in kept:
            _write(tdest / "runs" / d.name / src_file.name, src_file.read_bytes())
    for d, kept in superseded.items():
        for src_file in kept:
            _write(tdest / SUPERSEDED_DIR / d.name / src_file.name, src_file.read_bytes())
    vdir = verdicts[0].parent
    for name in ("registered-verdict.json", "registered-report.md", "report.md"):
        if (vdir / name).is_file():
            _write(tdest / "analysis" / name, (vdir / name).read_bytes())
    for p in sorted((td / "predictions").glob("*.score.*")):
        _write(tdest / "predictions" / p.name, p.read_bytes())
    (dest / README).write_text(_readme(dest.name, test or ref.name or td.name, ref, frozen, note))

    files: list[dict[str, Any]] = [
        {"path": p.relative_to(dest).as_posix(), "sha256": sha256_file(p), "size": p.stat().st_size}
        for p in sorted(dest.rglob("*"))
        if p.is_file()
    ]
    total = sum(int(f["size"]) for f in files)
    doc = {
        "format": FORMAT,
        "format_version": 1,
        "test": test,
        "registration": {"name": ref.name, "path": ref.path, "sha256": ref.sha256, "commit": ref.commit},
        "freezes": frozen,
        "verdict": f"{TEST}/analysis/registered-verdict.json",
        "plans": "included: each run's frozen plan, whose bytes `provenance verify` compares with the registered hash",
        "left_out": "the JSONL the Parquet tables compact, server and job logs, figures",
        "made_at": utc_now(),
        "command": portable_argv(sys.argv, git.path),
        "files": files,
        "total_bytes": total,
    }
    (dest / MANIFEST).write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    res = Packed(dest, files, total)
    if total > budget_bytes:
        res.warnings.append(f"{total / 1e6:.2f} MB is over the budget of {budget_bytes / 1e6:.1f} MB a bundle")
    every = sum(_bundle_bytes(b) for b in dest.resolve().parent.glob(f"*/{MANIFEST}"))
    if every > ALL_BUDGET_BYTES:
        res.warnings.append(
            f"the bundles beside it weigh {every / 1e6:.2f} MB in all, over the {ALL_BUDGET_BYTES / 1e6:.0f} MB allowed"
        )
    return res


def _bundle_bytes(manifest: Path) -> int:
    try:
        return int(orjson.loads(manifest.read_bytes()).get("total_bytes") or 0)
    except (OSError, orjson.JSONDecodeError, ValueError):
        return 0


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _readme(name: str, test: str, ref: Any, frozen: list[dict[str, Any]], note: str | None) -> str:
    lines = [
        f"# Evidence: registered test `{test}`",
        "",
        f"Registration `{ref.path}` (SHA-256 `{ref.sha256}`) at commit `{ref.commit}`"
        + (
            f"; frozen predictions {', '.join('`' + f['tag'] + '`' for f in frozen)}."
            if frozen
            else "; no prediction frozen."
        ),
        "",
        "Check it with no engine, no cluster and no git (docs/evidence.md):",
        "",
        f"    agentload evidence check evidence/{name}",
        "",
        "`bundle.json` lists every file with its SHA-256 and size; `test/` is the test directory (runs, manifest, "
        "accounting, freezes, proofs, verdict, scores), `repo/` the registration and the frozen prediction files at "
        "their repository paths, as committed.",
    ]
    if note:
        lines += ["", note.strip()]
    return "\n".join(lines) + "\n"
