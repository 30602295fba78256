"""docs/gpu-campaign.md, run: the page's `bash` blocks, exactly as written, in a fresh clone on a
machine without a GPU: the clone and the harness, the preflight on the emulator, the fill, the
registration (commit, push, check), the freeze of predictions and the dry run of the submission.

As for docs/tutorial.md (tests/integration/test_tutorial.py, whose helpers this uses): one bash
script with `set -euo pipefail`, a fresh HOME, `$AGENTLOAD_REPO` a bare repository holding this
checkout's files (so the registration's push and the remote's answers are real git), and the
install line replaced by an equivalent that links this test's own dependencies. The page's `sh`
blocks need a GPU cluster and are not run; the calibration's (step 4) is stood in for, as the page
says, by copying the paper's summaries where the calibration writes its own. No scheduler is
needed: `submit --dry-run` submits nothing. Time: about 1-2 minutes on a 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_tutorial import INSTALL_LINE, _git_env, fast_install, snapshot, stage_times, tutorial_blocks

from prereg.registration import load_registration

# scripts/test-phases.sh runs this module in its background session, beside the SLURM tests:
# it starts its own servers or clones and waits on them more than it computes.
pytestmark = pytest.mark.background

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "gpu-campaign.md"
REG = "prereg/registrations/e2-sglang-a100-300k-mysite.yaml"
STAND_IN = "mkdir -p prereg/inputs/mysite && cp -r prereg/inputs/paper/sglang-a100-300k prereg/inputs/mysite/"
IDENTITY = {"GIT_AUTHOR_NAME": "A Cluster User", "GIT_AUTHOR_EMAIL": "user@example.org",
            "GIT_COMMITTER_NAME": "A Cluster User", "GIT_COMMITTER_EMAIL": "user@example.org"}  # fmt: skip


def campaign_script(python: str) -> str:
    blocks = tutorial_blocks(DOC.read_text(encoding="utf-8"))
    out = ["set -euo pipefail", 'stage() { echo "@@stage $(date +%s.%N) $1"; }']
    stood_in = False
    for section, code in blocks:
        # the calibration (step 4, sh) writes the summaries on a GPU cluster; the design (5) reads them
        if section[:2] in ("5.", "6.") and not stood_in:
            out += ['stage "4. (stand-in: the paper\'s summaries)"', STAND_IN]
            stood_in = True
        out.append(f"stage {json.dumps(section)}")
        out.append(
            "\n".join(fast_install(python) if line.strip() == INSTALL_LINE else line for line in code.splitlines())
        )
    assert stood_in, f"{DOC}: no step 5 or 6 (the design, the fill) to stand the calibration in before"
    out.append('stage "end"')
    return "\n".join(out) + "\n"


@pytest.mark.timeout(900)
def test_the_campaign_page_runs_as_written_without_a_gpu(tmp_path: Path) -> None:
    commands = "\n".join(c for _, c in tutorial_blocks(DOC.read_text(encoding="utf-8")))
    assert INSTALL_LINE in commands
    needed_commands = (
        "agentload smoke --engine emulator",
        "agentload prereg design",
        "agentload prereg fill",
        "git push",
        "agentload prereg check",
        "agentload predict freeze",
        "agentload submit",
        "--dry-run",
    )
    for needed in needed_commands:
        assert needed in commands, f"{DOC}: no `{needed}` among the page's commands"
    home, folder = tmp_path / "home", tmp_path / "user"
    home.mkdir()
    folder.mkdir()
    src = snapshot(tmp_path / "agentload-src")
    remote = tmp_path / "team-remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(src), str(remote)], check=True, env=_git_env(home))
    env = {**_git_env(home), **IDENTITY, "AGENTLOAD_REPO": str(remote)}
    env.pop("HF_HOME", None)
    (tmp_path / "campaign.sh").write_text(campaign_script(sys.executable))
    proc = subprocess.run(
        ["bash", str(tmp_path / "campaign.sh")], cwd=folder, env=env, capture_output=True, text=True, timeout=840
    )
    log = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    (tmp_path / "campaign.log").write_text(log)
    print("\n".join(f"stage {s:<45} {t:7.1f} s" for s, t in stage_times(proc.stdout)))
    assert proc.returncode == 0, f"the page's commands failed (exit {proc.returncode}); the last output:\n{log[-6000:]}"
    work = folder / "agentload"
    smoke = json.loads((work / "results/preflight/emulator-sglang-a100-300k/smoke.json").read_text())
    assert smoke["passed"] and smoke["cell"] == "sglang-a100-300k", smoke["reason"]
    design = work / "results/design-e2-sglang-a100-300k.yaml"  # the design step's record, for reading (not bound)
    assert design.exists() and "design of e2-sglang-a100-300k" in proc.stdout
    assert not (work / "prereg/inputs/mysite/sglang-a100-300k/design.yaml").exists()
    reg = load_registration(work / REG)
    assert reg.status == "FILLED" and len(reg.plans) == 18 and reg.name == "e2-sglang-a100-300k-mysite"
    pushed = subprocess.run(
        ["git", "log", "--format=%s", "-3", "main"], cwd=remote, capture_output=True, text=True, check=True
    ).stdout
    assert "registration e2-sglang-a100-300k-mysite" in pushed
    tags = subprocess.run(
        ["git", "tag", "--list", "pred-e2-sglang-a100-300k-mysite"], cwd=remote, capture_output=True, text=True
    ).stdout
    assert tags.strip() == "pred-e2-sglang-a100-300k-mysite"
    assert list((work / "results/e2-mysite/provenance/freezes").glob("*"))
    # the dry run: every job, the cost, the script; nothing submitted
    out = proc.stdout
    for text in (
        "jobs     18 via slurm (dry run: nothing submitted)",
        "cost     18 job(s) x 9,780 s x 1 GPU = 48.9 GPU-hours",
        "#SBATCH --array=0-17%18",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --time=182",
        "#SBATCH --partition=gpu",
        "#SBATCH --account=myaccount",
        "#SBATCH --mem=64G",
        "export HF_HUB_OFFLINE=1",
        "label    pre-registered",
    ):
        assert text in out, (text, out[-4000:])
    assert not (work / "results/e2-mysite/submission.json").exists()
