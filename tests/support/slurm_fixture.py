"""A fixture project for submission tests: a git repository (with a bare remote) holding a copy of
the project's code and small registrations filled by formula, so jobs run the code of the
registration's commit exactly as they would in a user's clone.

The mini E2 protocol is sized for a CI budget: 1800 plan seconds, a 120-session burst at 100 s,
judged over [1000, 1800), with the E2 rule's slope factor lowered to 0.25 (a window of 800 s
measures the trapped slope less precisely than the paper's 3000 s), on the paper's SGLang 300k
inputs. The integration test registers one rate, halfway across the window (1.5 x lambda_ref),
and one seed, 3: in the simulator its BURST run is trapped with a slope 2.6 times the threshold,
its NOBURST run recovers, and its CAPPED run's gate is empty from 766 s, over 700 s before the last
300 s that RECOVERED judges, so an emulated engine a little slower than the model (the HTTP
round trips and timer lateness of a wall clock) still gives the same states. (Seeds 3-8 at 1.5:
BURST trapped in five, CAPPED gates empty between 766 and 1539 s.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

from support.gitfixture import git, make_repo

from provenance.codepaths import CODE_DIRS

ROOT = Path(__file__).resolve().parents[2]
CODE = (*(d.rstrip("/") for d in CODE_DIRS), "configs")  # every code package, and the configs

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


def template(
    name: str,
    *,
    seeds: str = "[3, 4, 5]",
    arms: str = "[burst, noburst, capped]",
    fractions: str = "[[3, 4]]",
    allowances: str = "{start_s: 30.0, smoke_s: 20.0, teardown_s: 10.0}",
    protocol: str = "protocol-mini-e2.yaml",
    cell: str = "sglang-a100-300k",
    workload: str = "standard",
    rule: str = "e2",
    rule_overrides: str = "{slope_factor: 0.25}",
) -> str:
    return f"""format: agentload-registration-template
format_version: 1
name: {name}
test: {name}
description: a small registration for submission tests
cell: {cell}
workload: {workload}
protocol: {protocol}
arms: {arms}
seeds: {seeds}
rule: {rule}
rule_overrides: {rule_overrides}
allowances: {allowances}
fill: {{fractions: {fractions}}}
"""


def make_project(tmp: Path) -> tuple[Path, Path]:
    """(work tree, bare remote): the project's code committed and pushed, plus the paper's SGLang
    300k calibration inputs and the mini protocol (committed, pushed)."""
    work, remote = make_repo(tmp)
    for d in CODE:
        shutil.copytree(
            ROOT / d, work / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "registrations", "inputs")
        )
    shutil.copytree(
        ROOT / "prereg" / "inputs" / "paper" / "sglang-a100-300k", work / "prereg" / "inputs" / "sglang-a100-300k"
    )
    (work / "prereg" / "templates").mkdir(parents=True, exist_ok=True)
    (work / "prereg" / "templates" / "protocol-mini-e2.yaml").write_text(MINI_PROTOCOL)
    (work / ".gitignore").write_text("__pycache__/\n*.pyc\nresults/\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "the project's code and the inputs")
    git(work, "push", "-q", "origin", "main")
    return work, remote


def fill(work: Path, name: str, inputs: str = "sglang-a100-300k", **kw: str) -> Path:
    """Write a template and fill the registration prereg/registrations/<name>.yaml (uncommitted)."""
    from prereg.fill import fill_to_file

    t = work / "prereg" / "templates" / f"{name}.yaml"
    t.write_text(template(name, **kw))
    reg = work / "prereg" / "registrations" / f"{name}.yaml"
    reg.parent.mkdir(parents=True, exist_ok=True)
    fill_to_file(work / "prereg" / "inputs" / inputs, t, reg)
    return reg


def one_seed_rule(work: Path) -> str:
    """The E2 rule judged on one seed (a rate passes when its one seed does): three jobs make a
    verdict, which is what a CI budget affords on the emulator. Returns the template's rule ref."""
    import yaml

    from analysis.rules import load_rule

    e2 = load_rule("e2")
    spec = {
        **e2,
        "name": "e2-one-seed",
        "description": "E2 paired test judged on one seed (tests)",
        "params": {**e2["params"], "min_good_seeds": 1},
        "group": {**e2["group"], "min_seeds": 1},
    }
    (work / "prereg" / "templates" / "e2-one-seed.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return "e2-one-seed.yaml"


TINY_VLLM_CELL = {
    "kind": "cell",
    "name": "tiny-vllm-cpu",
    "description": "test cell: vLLM 0.32 on a CPU with a tiny random model",
    "engine": {"name": "vllm", "version": "0.32.0"},
    "model": "tiny",
    "gpu": "cpu",
    "kv_pool_tokens": 32_768,
    "page_size": 32,
    "schedule_policy": "fcfs",
    "chunked_prefill": 8_192,
    "max_running": 16,
    "prefix_cache": True,
    "waiting_prefix_refresh": False,
    "batching": "mixed",
    "context_length": 8_192,
}
TINY_WORKLOAD = {
    "kind": "workload",
    "name": "tiny",
    "first_prompt": 128,
    "tool_tokens": 32,
    "decode_tokens": 16,
    "turns": {"mean": 3.0, "cap": 4},
    "tool_time": {"mean": 0.3},
}
TINY_PROTOCOL = {
    "kind": "protocol",
    "name": "tiny",
    "description": "20 s runs for a CPU engine",
    "duration": 20.0,
    "burst": {"time": 5.0, "size": 3, "width": 1.0},
    "window": {"start": 10.0, "end": 20.0},
    "min_window": 5.0,
    "backlog_bin": 1.0,
    "hit_bin": 2.0,
    "recovered_span": 5.0,
    "gauge_interval": 1.0,
}


def tiny_vllm(work: Path, scale: float = 10.0) -> Path:
    """A FILLED one-job registration (NOBURST, seed 0) of a tiny CPU vLLM cell, 20 s runs.

    Its calibration inputs are the paper's SGLang 300k inputs with every rate multiplied by
    `scale` (the fill works in multiples of lambda_ref, so it places the same multiples): test
    numbers for a cell nobody calibrated, good for running one job, not for judging it."""
    import yaml

    src = work / "prereg" / "inputs" / "sglang-a100-300k"
    dst = work / "prereg" / "inputs" / "tiny-vllm-cpu"
    dst.mkdir(parents=True, exist_ok=True)
    rates = ("mu_sessions", "mu_turns", "lambda_ref", "lambda_ref_se", "lambda_sessions", "lambda_sessions_se")

    def scaled(d: object) -> object:
        if isinstance(d, dict):
            return {k: (v * scale if k in rates and isinstance(v, (int, float)) else scaled(v)) for k, v in d.items()}
        if isinstance(d, list):
            return [scaled(x) for x in d]
        return d

    for f in ("stage-c.yaml", "e0a.yaml", "e0b.yaml"):
        data = scaled(yaml.safe_load((src / f).read_text()))
        data["cell"] = "tiny-vllm-cpu"
        data["source"] = f"test numbers: the paper's SGLang 300k {f} with rates x {scale:g}"
        (dst / f).write_text(yaml.safe_dump(data, sort_keys=False))
    t = work / "prereg" / "templates"
    for name, data in (
        ("tiny-vllm-cpu.yaml", TINY_VLLM_CELL),
        ("tiny-workload.yaml", TINY_WORKLOAD),
        ("tiny-protocol.yaml", TINY_PROTOCOL),
    ):
        (t / name).write_text(yaml.safe_dump(data, sort_keys=False))
    return fill(
        work,
        "tiny-vllm",
        inputs="tiny-vllm-cpu",
        cell="tiny-vllm-cpu.yaml",
        workload="tiny-workload.yaml",
        protocol="tiny-protocol.yaml",
        arms="[noburst]",
        seeds="[0]",
        fractions="[[1, 2]]",
        allowances="{start_s: 300.0, smoke_s: 120.0, teardown_s: 30.0}",
        rule_overrides="{min_window: 5.0, backlog_bin: 1.0, recovered_span: 5.0}",
    )


def commit(work: Path, message: str, *, push: bool = False) -> str:
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", message)
    if push:
        git(work, "push", "-q", "origin", "main")
    return git(work, "rev-parse", "HEAD")
