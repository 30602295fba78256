"""docs/tutorial.md's real-engine steps, run as the page writes them: one arm on the real CPU vLLM
(step 11) and on the real CPU SGLang (step 12).

After the page's clone and environment (the first two blocks of step 0; the same snapshot of this
checkout, fresh folder and fresh HOME as tests/integration/test_tutorial.py), the step's `sh` block
is run as written: the tiny random model built offline with the engine's own python, then
`agentload run` of NOBURST on the step's cell (`vllm-cpu-tiny-131k`, `sglang-cpu-tiny-32k`) with a
launched server. The run must complete on a server that passed Stage 0 smoke and the flush +
canary, with requests the engine answered and prefix-cache hits it reported itself. On SGLang also:
the server was started with the cell's CPU settings; a handful of sessions finish; per request
(usage.prompt_tokens_details, which --enable-cache-report turns on) every follow-up reuses the
previous prompt and output but its last token, the radix cache's rule on 1-token pages; SGLang's
cumulative cached-token counter grows during the run.

Needs the engine's python (AGENTLOAD_VLLM_PYTHON, AGENTLOAD_SGLANG_PYTHON; scripts/ci-engine-tests.sh
sets them); skipped without it or with AGENTLOAD_SKIP_VLLM=1 / AGENTLOAD_SKIP_SGLANG=1. Markers vllm,
sglang. On a 2-core machine: vLLM about 6 minutes under a load average of 11-14, 5 of them the
server's start; SGLang 133 s at a load of about 2 (the model 16 s, the server's start 39 s, 94-169 s
when the load is 6-18, smoke + canary + stop 19 s, the drive 57 s). The first test (no engine)
checks that the tutorial's SGLang cell is the cell the real-engine suite proves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from test_tutorial import DOC, _git_env, snapshot, stage_times, tutorial_blocks, tutorial_script

from harness.recording.record import load_run

# scripts/test-phases.sh runs this module in its background session, beside the SLURM tests:
# it starts its own servers or clones and waits on them more than it computes.
pytestmark = pytest.mark.background

SGLANG_CELL = "sglang-cpu-tiny-32k"
SGLANG_RUN = "results/tutorial-sglang/noburst-r0.50-s0"
VLLM_RUN = "results/tutorial-vllm/noburst-r0.50-s0"


def test_the_tutorials_sglang_cell_is_the_one_the_real_sglang_suite_tests() -> None:
    """Step 12 launches SGLang from configs/cells/sglang-cpu-tiny-32k.yaml; the engine suite
    (test_engines_real.py) proves the CPU server with the cell live_engines.py writes. They must be
    the same engine settings, so that what the suite found holds for the tutorial's server."""
    from live_engines import cell_data

    from harness.config import CellConfig, load_config

    shipped = load_config(f"cells/{SGLANG_CELL}", CellConfig).model_dump(exclude={"name", "description", "gpu"})
    suite = CellConfig.model_validate(cell_data("sglang")).model_dump(exclude={"name", "description", "gpu"})
    assert shipped == suite
    (block,) = [c for s, c in tutorial_blocks(DOC.read_text(encoding="utf-8"), lang="sh") if s.startswith("12.")]
    assert "configs/tests/tutorial-sglang.yaml" in block and f"--out {SGLANG_RUN}" in block
    assert "--engine sglang" in block


def follow_up_hits(turns: Any, page: int) -> tuple[int, int, list[tuple[int, int, int, int]]]:
    """(follow-ups, those whose cached tokens are exactly the previous prompt + output but its last
    token in whole pages, the others as (session, turn, cached, expected)). A follow-up is an
    answered turn right after its session's answered previous turn."""
    from harness.servers.smoke import expected_cached

    n, exact, other = 0, 0, []
    for sid, g in turns.sort_values(["session", "turn"]).groupby("session"):
        g = g[g["status"] == "ok"].reset_index(drop=True)
        for k in range(1, len(g)):
            if int(g.loc[k, "turn"]) != int(g.loc[k - 1, "turn"]) + 1:
                break
            want = expected_cached(int(g.loc[k - 1, "prompt_tokens"]) + int(g.loc[k - 1, "n_output_ids"]), page)
            got = int(g.loc[k, "cached_tokens"])
            n += 1
            if got == want:
                exact += 1
            else:
                other.append((int(sid), int(g.loc[k, "turn"]), got, want))
    return n, exact, other


def check_vllm(meta: dict[str, Any], run: Any, record_property: Any) -> None:
    turns = run.turns
    ok = turns[turns["status"] == "ok"]
    assert len(ok) > 20 and (ok["cached_tokens"] > 0).mean() > 0.3, (len(ok), ok["cached_tokens"].describe())
    print(
        f"vLLM arm: {len(ok)} turns answered, {float((ok['cached_tokens'] > 0).mean()):.2f} of them with cached tokens "
        f"the engine reported; server start {meta.get('engine_start')}"
    )


def check_sglang(meta: dict[str, Any], run: Any, record_property: Any) -> None:
    assert meta["cell"]["name"] == SGLANG_CELL and meta["references"]["lambda_ref"] == 0.4, (
        meta["cell"],
        meta["references"],
    )
    # the CPU engine was selected by the cell's fields, not by anything the command added
    launch = meta["engine_launch"]
    argv = launch["argv"]
    assert argv[argv.index("--device") + 1] == "cpu" and argv[argv.index("--mem-fraction-static") + 1] == "0.5", argv
    assert "--sleep-on-idle" in argv and launch["env"].get("SGLANG_USE_CPU_ENGINE") == "1", launch
    turns, sessions, gauges = run.turns, run.sessions, run.gauges
    ok = turns[turns["status"] == "ok"]
    completed = int((sessions["outcome"] == "completed").sum())
    assert completed >= 3 and len(ok) >= 15, (completed, sessions["outcome"].value_counts().to_dict(), len(ok))
    n, exact, other = follow_up_hits(turns, page=1)
    # On 1-token pages a follow-up whose session's KV is still in the radix cache reuses exactly the
    # previous prompt and output but its last token; the pool (32,768 tokens) holds every session
    # this load keeps open, so at most a stray eviction of a long-idle prefix may differ.
    assert n >= 10 and exact >= 0.9 * n and all(got <= want for _, _, got, want in other), (n, exact, other[:10])
    counter = gauges["cached_tokens_total"].dropna()
    assert len(counter) >= 2 and counter.iloc[-1] > counter.iloc[0], counter.tolist()
    start = float(meta["engine_start"]["seconds"])
    drive = float(meta["drive"]["wall_seconds"])
    rest = float(meta["wall_s"]) - start - drive
    record_property(
        "run_wall_s",
        json.dumps({"server_start": start, "drive": drive, "preflight_and_stop": rest, "run": meta["wall_s"]}),
    )
    print(
        f"SGLang arm: {completed} of {len(sessions)} sessions completed, {len(ok)} turns answered, {exact} of {n} "
        f"follow-ups with exactly the expected cached tokens ({int(ok['cached_tokens'].sum())} cached of "
        f"{int(ok['prompt_tokens'].sum())} prompt tokens); the engine's counter rose by "
        f"{counter.iloc[-1] - counter.iloc[0]:.0f}. Run {float(meta['wall_s']):.1f} s: server start {start:.1f} s, "
        f"smoke + canary + stop {rest:.1f} s, drive {drive:.1f} s; host load {meta.get('host_load')}"
    )


@dataclass(frozen=True)
class Step:
    """A real-engine step of the tutorial and what its run must show."""

    engine: str
    step: str  # the tutorial's section number
    python_var: str
    run: str  # the run directory the step's command writes, under the clone
    timeout_s: float
    check: Callable[[dict[str, Any], Any, Any], None]


STEPS = [
    pytest.param(
        Step("vllm", "11.", "AGENTLOAD_VLLM_PYTHON", VLLM_RUN, 900.0, check_vllm),
        marks=[pytest.mark.vllm, pytest.mark.timeout(900)],
        id="vllm",
    ),
    pytest.param(
        Step("sglang", "12.", "AGENTLOAD_SGLANG_PYTHON", SGLANG_RUN, 1200.0, check_sglang),
        marks=[pytest.mark.sglang, pytest.mark.timeout(1200)],
        id="sglang",
    ),
]


@pytest.mark.wallclock
@pytest.mark.parametrize("step", STEPS)
def test_one_tutorial_arm_on_the_real_cpu_engine(step: Step, tmp_path: Path, record_property: Any) -> None:
    python = os.environ.get(step.python_var)
    if not python:
        pytest.skip(f"{step.python_var} is not set ({step.engine}'s python; scripts/ci-engine-tests.sh)")
    skip = f"AGENTLOAD_SKIP_{step.engine.upper()}"
    if os.environ.get(skip) == "1":
        pytest.skip(f"{skip}=1: the real-{step.engine} tests are skipped")
    text = DOC.read_text(encoding="utf-8")
    setup = [(s, c) for s, c in tutorial_blocks(text) if s.startswith("0.") and "cluster.sh" not in c]
    real = [(s, c) for s, c in tutorial_blocks(text, lang="sh") if s.startswith(step.step)]
    assert len(setup) == 2 and len(real) == 1, (setup, real)
    home, folder = tmp_path / "home", tmp_path / "newcomer"
    home.mkdir()
    folder.mkdir()
    src = snapshot(tmp_path / "agentload-src")
    env = {**_git_env(home), "AGENTLOAD_REPO": str(src), step.python_var: str(python)}
    script = tutorial_script(
        setup + real, pip=os.environ.get("AGENTLOAD_TUTORIAL_PIP") == "1", browser=False, python=sys.executable
    )
    sh = tmp_path / f"tutorial-{step.engine}.sh"
    sh.write_text(script)
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(sh)], cwd=folder, env=env, capture_output=True, text=True, timeout=step.timeout_s - 30
    )
    log = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    (tmp_path / f"tutorial-{step.engine}.log").write_text(log)
    times = stage_times(proc.stdout)
    print("\n".join(f"stage {s:<55} {t:7.1f} s" for s, t in times) + f"\ntotal {time.monotonic() - t0:.0f} s")
    record_property("stage_wall_s", json.dumps(times))
    assert proc.returncode == 0, (
        f"step {step.step[:-1]} failed (exit {proc.returncode}); the last output:\n{log[-6000:]}"
    )

    run_dir = folder / "agentload" / step.run
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "COMPLETED" and meta["engine_backend"] == step.engine, (
        meta["status"],
        meta.get("status_reason"),
    )
    pre = meta["preflight"]
    assert pre["smoke"]["passed"] and pre["canary"]["passed"], pre
    step.check(meta, load_run(run_dir), record_property)
