"""A small registered test directory built with the real parts, for `status` and the HTML report:
a fixture repository with a bare remote, a committed and pushed registration, model F predictions
and simulator predictions with their flip margins frozen before the runs, a submission manifest (a
real question to the remote), four short simulated runs bound to the registration, the registered
verdict, and the scored predictions.

The pieces whose commands belong to other parts (the submission, the job script's binding) are
written the way provfixture writes them; the rest goes through the project's own commands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from support.gitfixture import git, make_repo
from support.paths import REPO
from support.provfixture import commit_registration, record_submission, run_all, write_test

from cli.main import main
from harness.config import load_test
from runs.arms import run_name

PAPER_E0A = REPO / "prereg" / "inputs" / "paper" / "sglang-a100-300k" / "e0a.yaml"


def _bind_code(run: Path, commit: str) -> None:
    """The runs execute this checkout's code; in the fixture repository the registration's commit
    stands for it (as a job started from that commit would record)."""
    m = orjson.loads((run / "meta.json").read_bytes())
    m["provenance"] = {**(m.get("provenance") or {}), "git": {"commit": commit, "dirty": False}}
    (run / "meta.json").write_bytes(orjson.dumps(m, option=orjson.OPT_INDENT_2))


def build_world(root: Path, monkeypatch: Any) -> dict[str, Any]:
    from prereg.predict_sim import simulator_predictions
    from prereg.predict_theory import model_f_predictions
    from prereg.predictions import write_predictions
    from review.registered import registered_analysis

    work, remote = make_repo(root)
    test_path = write_test(work)
    bundle = load_test(test_path)
    binding = commit_registration(work, bundle)
    reg_file = work / binding["path"]
    testdir = root / "results" / "tiny-e2"
    mf = write_predictions(model_f_predictions(test_path, registration=reg_file), work / "predictions" / "tiny-mf.yaml")
    # the simulator's, with flip margins judged against the paper's E0a seed spread (BURST, one fresh seed: small)
    sim = write_predictions(
        simulator_predictions(test_path, registration=reg_file, n_seeds=1, arms=["burst"], e0a=PAPER_E0A),
        work / "predictions" / "tiny-sim.yaml",
    )
    assert main(["predict", "freeze", str(mf), str(sim), "--tag", "pred-tiny", "--testdir", str(testdir)]) == 0
    time.sleep(1.1)  # run times are recorded to the second: the runs start strictly after the freeze
    grid = [(a, r, s) for a in bundle.arms for r in bundle.test.rates for s in bundle.test.seeds]
    jobs = [
        {"job_id": str(101 + i), "arm": a, "rate": r, "seed": s, "run_dir": f"runs/{run_name(a, r, s)}"}
        for i, (a, r, s) in enumerate(grid)
    ]
    record_submission(testdir, work, binding, label="pre-registered", jobs=jobs)
    runs = run_all(test_path, testdir, binding)
    for d in runs:
        _bind_code(d, binding["commit"])
    monkeypatch.chdir(work)
    verdict = registered_analysis(reg_file, [testdir / "runs"], testdir / "analysis")
    assert main(["predict", "score", "pred-tiny", str(testdir)]) == 0
    return {
        "root": root,
        "work": work,
        "remote": remote,
        "test": test_path,
        "bundle": bundle,
        "binding": binding,
        "testdir": testdir,
        "runs": runs,
        "jobs": jobs,
        "verdict": verdict,
        "reg_file": reg_file,
    }


def squeue_runner(states: dict[str, str]) -> Any:
    """A scheduler that answers squeue with the given states (and knows no other job)."""
    from slurm.scheduler import CommandResult

    def run(argv: Any, env: Any) -> Any:
        if argv[0] == "squeue":
            return CommandResult(0, "".join(f"{j}|{s}\n" for j, s in states.items()), "")
        if argv[0] == "sacct":
            return CommandResult(0, "", "")
        return CommandResult(1, "", f"unexpected command {argv[0]}")

    return run


def copy_world(world: dict[str, Any], dest: Path) -> Path:
    """A copy of the test directory (the repository stays shared) for tests that change it."""
    import shutil

    shutil.copytree(world["testdir"], dest)
    return dest


def git_head(work: Path) -> str:
    return git(work, "rev-parse", "HEAD")
