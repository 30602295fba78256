"""A test directory as one object: where each record of a registered test lies, read through the
reader of the part that writes it.

Why one place: `agentload status` and the HTML report both need every record of a test (the
registration, the submission, the scheduler's accounting, the runs, the verdict, the frozen and
scored predictions, the provenance checks). Each is written by a different step and may be absent
because that step has not happened yet (no predictions frozen, no job submitted, nothing scored) or
because this checkout lacks the part that reads it. Both readers must then say so in words, never
fail. Every record is therefore a `Piece` with a state:

  present      read by its owner's reader; `value` holds what the reader returned
  absent       the file is not there; `note` says which file and what step writes it
  error        the file is there but its reader refused it; `note` holds the reader's message

The layout (docs/report.md) is the one the parts agree on:

  <testdir>/submission.json                 submission manifest        (slurm submission)
  <testdir>/provenance/accounting.json      scheduler accounting export
                                            (slurm.accounting_export.write_accounting_export)
  <testdir>/provenance/freezes/*.json       freeze records of predictions (predict freeze)
  <testdir>/provenance/proofs/*/proof.json  proofs of unchanged files   (provenance prove)
  <testdir>/runs/<run>/meta.json ...        run directories (or <testdir>/<run>/ from `test run --out`)
  <testdir>/predictions/<tag>.score.json    scored predictions          (predict score)
  a verdict: registered-verdict.json (analyze --registration) or verdict.json (analyze, test run)
             in <testdir>, or one or two folders below it, with report.md and figure.png beside it
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson

from harness.errors import ConfigError
from prereg.registration import load_registration
from provenance.git import Repo
from review.records import read_manifest, read_run
from review.timeline import build_timeline
from review.verify import verify_test
from slurm.accounting_export import read_accounting_export

PRESENT, ABSENT, ERROR = "present", "absent", "error"
VERDICT_FILES = ("registered-verdict.json", "verdict.json")
_SKIP_PARTS = {"provenance", "proofs", "predictions", "judged", ".git"}


@dataclass
class Piece:
    """One record of the test directory and what its reader made of it."""

    name: str
    state: str
    path: str | None = None
    value: Any = None
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.state == PRESENT

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "path": self.path, "note": self.note}


def _read(name: str, path: Path | None, reader: Callable[[], Any], absent_note: str) -> Piece:
    if path is not None and not path.exists():
        return Piece(name, ABSENT, str(path), note=absent_note)
    try:
        value = reader()
    except Exception as exc:  # the owner's reader refused the file: its message is the note
        return Piece(name, ERROR, str(path) if path else None, note=f"{type(exc).__name__}: {exc}")
    if value is None:
        return Piece(name, ABSENT, str(path) if path else None, note=absent_note)
    return Piece(name, PRESENT, str(path) if path else None, value)


def _load_json(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


@dataclass
class RunEntry:
    """A run directory: its meta.json as the provenance reader sees it, or why it could not."""

    path: Path
    record: Any | None  # review.records.RunRecord
    meta: dict[str, Any] | None
    error: str = ""

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def status(self) -> str:
        return str((self.meta or {}).get("status") or ("UNREADABLE" if self.error else "UNKNOWN"))


def run_dirs(testdir: Path) -> list[Path]:
    """Run directories: under <testdir>/runs/ when it exists, else directly under <testdir>.
    Symbolic links to run directories are followed (a test directory assembled from links)."""
    base = testdir / "runs" if (testdir / "runs").is_dir() else testdir
    out = []
    for root, dirs, files in os.walk(base, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_PARTS and d not in ("analysis", "registered-analysis"))
        if "meta.json" in files:
            out.append(Path(root))
            dirs[:] = []  # nothing inside a run directory is another run
    return sorted(out)


def find_verdicts(testdir: Path) -> list[Path]:
    """Verdict files in the test directory, the registered one first, then the shallowest.

    A registered-verdict.json holds the verdict and the registered block together, so where both
    lie in one folder the registered file is the one to read."""
    runs = set(run_dirs(testdir))
    found: list[Path] = []

    def walk(d: Path, depth: int) -> None:
        if d in runs or d.name in _SKIP_PARTS:
            return
        for name in VERDICT_FILES:
            if (d / name).is_file():
                found.append(d / name)
        if depth < 3:
            for sub in sorted(p for p in d.iterdir() if p.is_dir()):
                walk(sub, depth + 1)

    if testdir.is_dir():
        walk(testdir, 0)
    return sorted(found, key=lambda p: (p.name != "registered-verdict.json", len(p.relative_to(testdir).parts), str(p)))


@dataclass
class TestDir:
    """Every record of one test directory, read lazily, each through its owner's reader."""

    path: Path
    repo_hint: Any = None  # a provenance.git.Repo, or None to find the one holding the test directory
    registration_hint: Path | None = None  # the registration file, for a test not yet submitted
    notes: list[str] = field(default_factory=list)

    # -- git -------------------------------------------------------------------------------------
    @cached_property
    def repo(self) -> Any | None:
        if self.repo_hint is not None:
            return self.repo_hint
        for start in (self.path, Path.cwd()):
            try:
                return Repo.containing(start)
            except Exception:
                continue
        return None

    # -- records ---------------------------------------------------------------------------------
    @cached_property
    def manifest(self) -> Piece:
        p = self.path / "submission.json"
        return _read(
            "submission manifest",
            p,
            lambda: read_manifest(self.path),
            "no submission manifest: the test was not submitted to the scheduler (or ran locally)",
        )

    @cached_property
    def accounting(self) -> Piece:
        """The scheduler's accounting export, read by the reader of its writer
        (slurm.accounting_export.read_accounting_export): {job id: AccountingRow}."""
        p = self.path / "provenance" / "accounting.json"
        return _read(
            "accounting export",
            p,
            lambda: {r.job_id: r for r in read_accounting_export(p)},
            "no scheduler accounting export yet (written once the jobs have ended)",
        )

    @cached_property
    def runs(self) -> list[RunEntry]:
        out = []
        for d in run_dirs(self.path):
            try:
                meta = _load_json(d / "meta.json")
            except (OSError, orjson.JSONDecodeError) as exc:
                out.append(RunEntry(d, None, None, f"meta.json unreadable: {exc}"))
                continue
            rec, err = None, ""
            try:
                rec = read_run(d)
            except Exception as exc:  # the reader's refusal is what the report shows
                err = str(exc)
            out.append(RunEntry(d, rec, meta, err))
        return out

    @cached_property
    def registration_ref(self) -> dict[str, Any] | None:
        """{name, path, sha256, commit} of the registration: the manifest's, else a run's binding."""
        if self.manifest.ok:
            r = self.manifest.value.registration
            return {
                "name": r.name,
                "path": r.path,
                "sha256": r.sha256,
                "commit": r.commit,
                "source": "submission manifest",
            }
        for r in self.runs:
            b = (r.meta or {}).get("registration")
            if isinstance(b, dict) and b.get("path"):
                return {**{k: b.get(k) for k in ("name", "path", "sha256", "commit")}, "source": f"{r.name}/meta.json"}
        if self.registration_hint is not None:
            return {
                "name": None,
                "path": str(self.registration_hint),
                "sha256": None,
                "commit": None,
                "source": "command line (--registration)",
            }
        return None

    def _registration_file(self, rel: str) -> Path:
        p = Path(rel)
        if p.is_absolute():
            return p
        roots: list[Path] = ([self.repo.path] if self.repo is not None else []) + [Path.cwd(), self.path]
        for root in roots:
            if (root / p).is_file():
                return root / p
        return (roots[0] / p) if roots else p

    @cached_property
    def registration(self) -> Piece:
        ref = self.registration_ref
        if ref is None:
            return Piece(
                "registration",
                ABSENT,
                None,
                note="no registration binds this test: neither a submission manifest nor any run's meta.json names one",
            )
        path = self._registration_file(str(ref["path"]))
        return _read(
            "registration",
            path,
            lambda: load_registration(path),
            f"the registration file {ref['path']} named by the {ref['source']} is not in this checkout",
        )

    @cached_property
    def verdicts(self) -> list[Path]:
        return find_verdicts(self.path)

    @cached_property
    def verdict(self) -> Piece:
        found = self.verdicts
        if not found:
            return Piece(
                "verdict",
                ABSENT,
                None,
                note="not scored yet: no verdict.json or registered-verdict.json in the test directory",
            )
        p = found[0]
        try:
            v = _load_json(p)
        except (OSError, orjson.JSONDecodeError) as exc:
            return Piece("verdict", ERROR, str(p), note=f"{p}: not valid JSON ({exc})")
        if not isinstance(v, dict) or "verdict" not in v:
            return Piece("verdict", ERROR, str(p), note=f"{p}: no 'verdict' key; not a verdict file")
        return Piece("verdict", PRESENT, str(p), v)

    @cached_property
    def scores(self) -> list[Piece]:
        """Scored predictions (`predict score` reports) under <testdir>/predictions/."""
        out = []
        for p in sorted((self.path / "predictions").glob("*.score.json")):
            try:
                out.append(Piece("prediction scores", PRESENT, str(p), _load_json(p)))
            except (OSError, orjson.JSONDecodeError) as exc:
                out.append(Piece("prediction scores", ERROR, str(p), note=f"not valid JSON ({exc})"))
        return out

    @cached_property
    def freeze_records(self) -> list[Path]:
        return sorted((self.path / "provenance" / "freezes").glob("*.json"))

    @cached_property
    def verification(self) -> Piece:
        """review.verify's checks of the whole test (its timeline included)."""
        if not self.runs and not self.manifest.ok:
            return Piece("provenance verification", ABSENT, None, note="nothing to verify: no run and no submission")
        return _read(
            "provenance verification", None, lambda: verify_test(self.path, repo=self.repo), "nothing to verify"
        )

    @cached_property
    def timeline(self) -> Piece:
        v = self.verification
        if v.ok and v.value.timeline is not None:
            return Piece("provenance timeline", PRESENT, None, v.value.timeline)
        if not self.runs and not self.manifest.ok and not self.freeze_records:
            return Piece("provenance timeline", ABSENT, None, note="no record to order: no run, submission or freeze")
        return _read(
            "provenance timeline", None, lambda: build_timeline(self.path, repo=self.repo), "no record to order"
        )

    # -- derived ---------------------------------------------------------------------------------
    @property
    def test_name(self) -> str | None:
        if self.manifest.ok and self.manifest.value.test:
            return str(self.manifest.value.test)
        if self.registration.ok:
            return str(self.registration.value.test)
        if self.verdict.ok and self.verdict.value.get("test"):
            return str(self.verdict.value["test"])
        return next((str(r.meta["test"]) for r in self.runs if r.meta and r.meta.get("test")), None)

    def sibling(self, name: str) -> Path | None:
        """A file beside the verdict (report.md, figure.png, registered-report.md)."""
        if not self.verdict.ok or self.verdict.path is None:
            return None
        p = Path(self.verdict.path).parent / name
        return p if p.is_file() else None


def open_testdir(path: str | Path, *, repo: Any = None, registration: str | Path | None = None) -> TestDir:
    """The test directory at `path` (it must exist; every record in it may be absent).
    `registration` names the registration file of a test not yet submitted (the manifest and the
    runs' bindings, once they exist, name it themselves)."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(
            f"{p}: not a test directory (no such folder); expected the folder a test's runs, manifest and verdict are "
            "under"
        )
    return TestDir(p.resolve(), repo, Path(registration).resolve() if registration is not None else None)
