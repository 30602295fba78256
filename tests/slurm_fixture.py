"""A fixture project for submission tests: a git repository (with a bare remote) holding a copy of
the project's code and small registrations filled by formula, so jobs run the code of the
registration's commit exactly as they would in a user's clone.

The mini E2 protocol is sized for a CI budget: 1800 plan seconds, a 120-session burst at 100 s,
judged over [1000, 1800); one rate (3/4 across the window, 1.75 x lambda_ref), the E2 rule with the
slope factor lowered to 0.25 (a window of 800 s measures the trapped slope less precisely than the
paper's 3000 s), seeds 3-5, on the paper's SGLang 300k inputs. In the simulator its BURST runs are
trapped with slopes 2-4 times the threshold and its CAPPED and NOBURST runs recover, so the
verdict is PASS by a wide margin (tests/test_slurm_job.py checks that in virtual time).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gitfixture import git, make_repo

ROOT = Path(__file__).resolve().parents[1]
CODE = ("analysis", "harness", "prereg", "provenance", "slurm", "configs")

MINI_PROTOCOL = """kind: protocol
name: mini-e2
description: a mini E2 protocol for tests (1800 s, burst of 120 at 100 s, window [1000, 1800))
duration: 1800.0
burst: {time: 100.0, size: 120, width: 30.0}
window: {start: 1000.0, end: 1800.0}
min_window: 600.0
backlog_bin: 10.0
hit_bin: 100.0
recovered_span: 300.0
gauge_interval: 5.0
"""


def template(name: str, *, seeds: str = "[3, 4, 5]", arms: str = "[burst, noburst, capped]", fractions: str = "[[3, 4]]",
             allowances: str = "{start_s: 30.0, smoke_s: 20.0, teardown_s: 10.0}", protocol: str = "mini-e2.yaml") -> str:  # fmt: skip
    return f"""format: agentload-registration-template
format_version: 1
name: {name}
test: {name}
description: a mini E2 registration for submission tests
cell: sglang-a100-300k
workload: standard
protocol: {protocol}
arms: {arms}
seeds: {seeds}
rule: e2
rule_overrides: {{slope_factor: 0.25}}
allowances: {allowances}
fill: {{fractions: {fractions}}}
"""


def make_project(tmp: Path) -> tuple[Path, Path]:
    """(work tree, bare remote): the project's code committed and pushed, plus the paper's SGLang
    300k calibration inputs and the mini protocol (committed, pushed)."""
    work, remote = make_repo(tmp)
    for d in CODE:
        shutil.copytree(ROOT / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "registrations", "inputs"))
    shutil.copytree(ROOT / "prereg" / "inputs" / "paper" / "sglang-a100-300k", work / "prereg" / "inputs" / "sglang-a100-300k")
    (work / "prereg" / "templates").mkdir(parents=True, exist_ok=True)
    (work / "prereg" / "templates" / "mini-e2.yaml").write_text(MINI_PROTOCOL)
    (work / ".gitignore").write_text("__pycache__/\n*.pyc\nresults/\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "the project's code and the inputs")
    git(work, "push", "-q", "origin", "main")
    return work, remote


def fill(work: Path, name: str, **kw: str) -> Path:
    """Write a template and fill the registration prereg/registrations/<name>.yaml (uncommitted)."""
    from prereg.fill import fill_to_file

    t = work / "prereg" / "templates" / f"{name}.yaml"
    t.write_text(template(name, **kw))
    reg = work / "prereg" / "registrations" / f"{name}.yaml"
    reg.parent.mkdir(parents=True, exist_ok=True)
    fill_to_file(work / "prereg" / "inputs" / "sglang-a100-300k", t, reg)
    return reg


def commit(work: Path, message: str, *, push: bool = False) -> str:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    if push:
        git(work, "push", "-q", "origin", "main")
    return git(work, "rev-parse", "HEAD")
