"""docs/tutorial.md step 11, run: one arm on the real CPU vLLM, as the page writes it.

After the page's clone and environment (the first two blocks of step 0; the same snapshot of this
checkout, fresh folder and fresh HOME as tests/integration/test_tutorial.py), the `sh` block of
step 11 is run as written: the tiny random model built offline with vLLM's own python, then
`agentload run` of NOBURST on the `vllm-cpu-tiny-131k` cell with a launched vLLM server. The run
must complete on a server that passed Stage 0 smoke and the flush + canary, with requests the
engine answered and prefix-cache hits it reported itself.

Needs AGENTLOAD_VLLM_PYTHON (vLLM's python; /work/engine-venvs/vllm/bin/python here, set up by
scripts/ci-engine-tests.sh); skipped without it. Marker vllm. About 6 minutes on a 2-core machine
under a load average of 11-14, 5 of them the server's start.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_tutorial import DOC, _git_env, snapshot, stage_times, tutorial_blocks, tutorial_script

pytestmark = [pytest.mark.vllm]

VLLM_PYTHON = os.environ.get("AGENTLOAD_VLLM_PYTHON")
RUN = "results/tutorial-vllm/noburst-r0.50-s0"


@pytest.mark.skipif(
    not VLLM_PYTHON, reason="AGENTLOAD_VLLM_PYTHON is not set (vLLM's python; scripts/ci-engine-tests.sh)"
)
@pytest.mark.timeout(900)
def test_one_tutorial_arm_on_the_real_cpu_vllm(tmp_path: Path, record_property: Any) -> None:
    text = DOC.read_text(encoding="utf-8")
    setup = [(s, c) for s, c in tutorial_blocks(text) if s.startswith("0.") and "cluster.sh" not in c]
    real = [(s, c) for s, c in tutorial_blocks(text, lang="sh") if s.startswith("11.")]
    assert len(setup) == 2 and len(real) == 1, (setup, real)
    home, folder = tmp_path / "home", tmp_path / "newcomer"
    home.mkdir()
    folder.mkdir()
    src = snapshot(tmp_path / "agentload-src")
    env = {**_git_env(home), "AGENTLOAD_REPO": str(src), "AGENTLOAD_VLLM_PYTHON": str(VLLM_PYTHON)}
    script = tutorial_script(
        setup + real, pip=os.environ.get("AGENTLOAD_TUTORIAL_PIP") == "1", browser=False, python=sys.executable
    )
    (tmp_path / "tutorial-vllm.sh").write_text(script)
    t0 = time.monotonic()
    proc = subprocess.run(
        ["bash", str(tmp_path / "tutorial-vllm.sh")], cwd=folder, env=env, capture_output=True, text=True, timeout=870
    )
    log = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    (tmp_path / "tutorial-vllm.log").write_text(log)
    times = stage_times(proc.stdout)
    print("\n".join(f"stage {s:<55} {t:7.1f} s" for s, t in times) + f"\ntotal {time.monotonic() - t0:.0f} s")
    record_property("stage_wall_s", json.dumps(times))
    assert proc.returncode == 0, f"step 11 failed (exit {proc.returncode}); the last output:\n{log[-6000:]}"

    from harness.recording.record import load_run

    run_dir = folder / "agentload" / RUN
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "COMPLETED" and meta["engine_backend"] == "vllm", (
        meta["status"],
        meta.get("status_reason"),
    )
    pre = meta["preflight"]
    assert pre["smoke"]["passed"] and pre["canary"]["passed"], pre
    run = load_run(run_dir)
    turns = run.turns
    ok = turns[turns["status"] == "ok"]
    assert len(ok) > 20 and (ok["cached_tokens"] > 0).mean() > 0.3, (len(ok), ok["cached_tokens"].describe())
    print(
        f"vLLM arm: {len(ok)} turns answered, {float((ok['cached_tokens'] > 0).mean()):.2f} of them with cached tokens the engine reported; "
        f"server start {meta.get('engine_start')}"
    )
