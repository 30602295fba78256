"""A small registered test in a fixture repository with a bare remote: the test config, a
registration written by its documented keys (with the SHA-256 of every frozen plan), the binding a
job script writes into each run, and a submission manifest recorded the way the submit command
records it (a real question to the remote, with its time).

The registration fill and the submit command belong to other parts of the project; here they are
reduced to what the provenance checks read, so these tests exercise real git, real simulated runs
and real records, not mocks of them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import yaml
from support.gitfixture import git

from harness.config import TestBundle, load_test
from prereg.registration import load_registration
from provenance.git import Repo
from provenance.meta import sha256_file

PROTOCOL = """kind: protocol
name: tiny
description: a short E2-like protocol for tests (trap forms within 1800 s)
duration: 1800.0
burst: {time: 200.0, size: 200, width: 30.0}
window: {start: 1200.0, end: 1800.0}
min_window: 600.0
"""


def write_test(work: Path, seeds: tuple[int, ...] = (0, 1), burst: int = 200, name: str = "tiny-e2") -> Path:
    (work / "tests_cfg" / "protocols").mkdir(parents=True, exist_ok=True)
    (work / "tests_cfg" / "protocols" / "tiny.yaml").write_text(PROTOCOL.replace("size: 200", f"size: {burst}"))
    t = work / "tests_cfg" / f"{name}.yaml"
    t.write_text(
        f"kind: test\nname: {name}\ncell: sglang-a100-300k\nworkload: standard\nprotocol: protocols/tiny.yaml\n"
        f"arms: [burst, noburst]\nrates: [1.35]\nseeds: [{', '.join(map(str, seeds))}]\n"
    )
    return t


def plan_sha(bundle: TestBundle, arm: str, rate: float, seed: int) -> str:
    import hashlib

    from harness.workload.planfile import plan_bytes
    from harness.workload.plans import make_plan
    from runs.arms import references

    plan = make_plan(bundle.workload, bundle.protocol, bundle.arms[arm], rate, references(bundle)["lambda_ref"], seed)
    return hashlib.sha256(plan_bytes(plan)).hexdigest()


def registration_doc(bundle: TestBundle, name: str, status: str = "FILLED") -> dict[str, Any]:
    from analysis.rules import load_rule
    from runs.arms import references

    refs = references(bundle)
    t = bundle.test
    return {
        "format": "agentload-registration",
        "format_version": 1,
        "name": name,
        "status": status,
        "parent": None,
        "test": t.name,
        "cell": bundle.cell.model_dump(mode="json"),
        "workload": bundle.workload.model_dump(mode="json"),
        "protocol": bundle.protocol.model_dump(mode="json"),
        "arms": list(bundle.arms),
        "rates": [{"multiple": r, "sessions_per_s": r * refs["lambda_ref"]} for r in t.rates],
        "seeds": list(t.seeds),
        "cap": t.cap,
        "references": {
            "lambda_ref": refs["lambda_ref"],
            "lambda_miss": refs["lambda_ref"],
            "all_miss_token_rate": refs["all_miss_token_rate"],
        },
        "rule": load_rule("e2"),
        "kill_conditions": [],
        "warnings": [],
        "allowances": {"start_s": 900, "smoke_s": 120, "teardown_s": 60},
        "inputs": [],
        "plans": [
            {"arm": a, "rate": r, "seed": s, "sha256": plan_sha(bundle, a, r, s)}
            for a in bundle.arms
            for r in t.rates
            for s in t.seeds
        ],
        "fill": {"note": "written by the test fixture by the registration's documented keys"},
    }


def commit_registration(
    work: Path, bundle: TestBundle, name: str = "tiny-e2", push: bool = True, status: str = "FILLED"
) -> dict[str, Any]:
    rel = f"prereg/registrations/{name}.yaml"
    p = work / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(registration_doc(bundle, name, status), sort_keys=False))
    git(work, "add", rel)
    if (work / "tests_cfg").is_dir():
        git(work, "add", "tests_cfg")
    git(work, "commit", "-q", "-m", f"registration {name}")
    if push:
        git(work, "push", "-q", "origin", "main")
    reg = load_registration(p)  # the project's one loader accepts it
    assert reg.sha256 == sha256_file(p)
    return reg.binding(rel, git(work, "rev-parse", "HEAD"))


def record_submission(
    testdir: Path,
    work: Path,
    binding: dict[str, Any],
    label: str | None = None,
    jobs: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """submission.json as the submit command writes it: the remote asked, at submission, whether it
    holds the registration's commit. Sleeps past the second so later run times are strictly after."""
    chk = Repo(work).remote_contains(binding["commit"])
    doc = {
        "format": "agentload-submission",
        "format_version": 1,
        "test": None,
        "registration": binding,
        "remote_check": {
            "remote": chk.remote,
            "branch": chk.branch,
            "url": chk.url,
            "remote_head": chk.remote_head,
            "contains": chk.contains,
            "checked_at": chk.checked_at,
        },
        "jobs": jobs or [],
    }
    if label is not None:
        doc["label"] = label
    testdir.mkdir(parents=True, exist_ok=True)
    (testdir / "submission.json").write_text(json.dumps(doc, indent=2))
    time.sleep(1.1)
    return doc


def run_all(
    test_path: Path, testdir: Path, binding: dict[str, Any] | None, runs: list[tuple[str, float, int]] | None = None
) -> list[Path]:
    from runs.arms import execute_run, run_name

    bundle = load_test(test_path)
    todo = runs or [(a, r, s) for a in bundle.arms for r in bundle.test.rates for s in bundle.test.seeds]
    out = []
    for a, r, s in todo:
        res = execute_run(bundle, a, r, s, "sim", testdir / "runs" / run_name(a, r, s), registration=binding)
        assert res.status == "COMPLETED", res.reason
        out.append(Path(res.run_dir))
    return out
