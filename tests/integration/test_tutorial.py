"""docs/tutorial.md, run: the page's shell commands, exactly as written, in an empty folder.

The commands are the ```bash blocks of docs/tutorial.md, in order, as one bash script
(`set -euo pipefail`, so the first failing command fails the test). The folder is fresh, HOME is a
fresh folder too (no git identity, no pip or git configuration), and the project reaches it the way
it reaches a newcomer: `git clone` of `$AGENTLOAD_REPO`, here a repository holding a snapshot of
this checkout's files (tracked and untracked-but-not-ignored, so what is tested is what is in the
working tree). One line is replaced, and the page says so: the environment's `pip install`, by an
environment that links this test's own installed dependencies and the clone's code (a fresh
install takes minutes on a small machine); AGENTLOAD_TUTORIAL_PIP=1 runs it as written.

Then the same registered test is run locally in the simulator (the test's oracle, not a step of the
page): every registered arm x rate x seed, bound to the same registration, judged, its frozen
predictions scored and its provenance verified in a second test directory. The SLURM run on the
emulator must give the same verdict per rate, the same prediction outcomes (hit / miss per
prediction) and a verification that holds, as the simulator's.

Each stage's wall time (one per section of the page) is printed and kept as a property of the
test report. Time on a loaded 2-core machine: about 3-4 minutes, most of it the six emulator jobs
(1800 plan seconds each at time scale 150, two at a time).

Markers: slurm (the local cluster, tests/integration/conftest.py `slurm_cluster`). Chromium is
needed for the page's last step; without it, AGENTLOAD_SKIP_BROWSER=1 drops that one command.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.wallclock, pytest.mark.usefixtures("slurm_cluster")]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tutorial.md"
INSTALL_LINE = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[dev]'"
BROWSER_PREFIX = "python tests/support/browser_check.py"
TESTDIR = "results/tutorial"
SIMDIR = "results/tutorial-sim"
REG = "prereg/registrations/tutorial.yaml"
TAG = "pred-tutorial"


# ---------------------------------------------------------------------------------------------
# the page's commands
# ---------------------------------------------------------------------------------------------
def tutorial_blocks(text: str, lang: str = "bash") -> list[tuple[str, str]]:
    """(section title, code) of every ```bash block (or ```<lang>), in order. Only those blocks are
    commands; other fences (output shown as text, the optional real-engine step's `sh`) are not run."""
    blocks: list[tuple[str, str]] = []
    section, lines, fence = "preamble", [], None
    for line in text.splitlines():
        if fence is None:
            if line.startswith("## "):
                section = line[3:].strip()
            m = re.match(r"^```(\S*)\s*$", line)
            if m:
                fence, lines = m.group(1), []
            continue
        if line.strip() == "```":
            if fence == lang:
                blocks.append((section, "\n".join(lines)))
            fence = None
            continue
        lines.append(line)
    assert fence is None, f"{DOC}: a fenced block is not closed"
    return blocks


def fast_install(python: str) -> str:
    """What `python3 -m venv .venv && .venv/bin/pip install -e '.[dev]'` leaves, in a second: a
    virtual environment whose site-packages has the clone's code (an editable install is a path
    entry) and this test's installed dependencies, and the `agentload` entry point."""
    deps = sysconfig.get_paths()["purelib"]
    return "\n".join(
        [
            f"{python} -m venv --without-pip .venv",
            "SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')",
            'echo "$PWD" > "$SP/00-agentload-editable.pth"',
            f'echo "{deps}" > "$SP/zz-test-dependencies.pth"',
            "printf '#!%s\\nimport sys\\nfrom cli.main import main\\nsys.exit(main())\\n' "
            '"$PWD/.venv/bin/python" > .venv/bin/agentload',
            "chmod +x .venv/bin/agentload",
        ]
    )


def tutorial_script(blocks: list[tuple[str, str]], *, pip: bool, browser: bool, python: str) -> str:
    """One bash script: the blocks in order, each stage announced with its start time."""
    out = ["set -euo pipefail", 'stage() { echo "@@stage $(date +%s.%N) $1"; }']
    for section, code in blocks:
        out.append(f"stage {json.dumps(section)}")
        lines = []
        for line in code.splitlines():
            if line.strip() == INSTALL_LINE and not pip:
                lines.append(fast_install(python))
            elif line.startswith(BROWSER_PREFIX) and not browser:
                lines.append(f"echo 'AGENTLOAD_SKIP_BROWSER=1 and no Chromium: not run: {line}'")
            else:
                lines.append(line)
        out.append("\n".join(lines))
    out.append('stage "end"')
    return "\n".join(out) + "\n"


def stage_times(stdout: str) -> list[tuple[str, float]]:
    marks = [(float(m.group(1)), m.group(2)) for m in re.finditer(r"^@@stage (\S+) (.*)$", stdout, re.M)]
    return [(name, t1 - t0) for (t0, name), (t1, _) in itertools.pairwise(marks)]


def snapshot(dest: Path) -> Path:
    """A repository holding this checkout's files as one commit: what `$AGENTLOAD_REPO` is."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    for rel in filter(None, files.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    env = {
        **_git_env(dest.parent),
        "GIT_AUTHOR_NAME": "agentload",
        "GIT_AUTHOR_EMAIL": "agentload@example.org",
        "GIT_COMMITTER_NAME": "agentload",
        "GIT_COMMITTER_EMAIL": "agentload@example.org",
    }
    for argv in (
        ["git", "init", "-q", "-b", "main"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "-m", "agentload snapshot"],
    ):
        subprocess.run(argv, cwd=dest, check=True, env=env)
    return dest


def _git_env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "PYTHON", "VIRTUAL_ENV", "PIP_"))}
    path = os.pathsep.join(
        p for p in keep.get("PATH", "").split(os.pathsep) if Path(p).resolve() != Path(sys.executable).parent.resolve()
    )
    return {**keep, "PATH": path, "HOME": str(home)}


# ---------------------------------------------------------------------------------------------
# the oracle: the same registered test in the simulator, locally
# ---------------------------------------------------------------------------------------------
ORACLE = r"""
import json, subprocess, sys
from pathlib import Path
from cli.main import main
from runs.arms import execute_run, run_name
from prereg.registration import load_registration

reg = load_registration("{reg}")
commit = subprocess.run(
    ["git", "log", "-1", "--format=%H", "--", "{reg}"], capture_output=True, text=True, check=True
).stdout.strip()
binding = reg.binding("{reg}", commit)
bundle = reg.bundle()
for p in reg.plans:
    res = execute_run(bundle, p.arm, p.rate, p.seed, "sim", Path("{simdir}") / "runs" / run_name(p.arm, p.rate, p.seed),
                      registration=binding, expect_plan_sha256=p.sha256)
    assert res.status == "COMPLETED", (p, res.status, res.reason)
rcs = [main(["analyze", "--registration", "{reg}", "{simdir}/runs", "--out", "{simdir}/analysis"]),
       main(["predict", "score", "{tag}", "{simdir}"]),
       main(["provenance", "verify", "{simdir}"])]
print("oracle exit statuses", rcs)
"""


def _json(p: Path) -> Any:
    return json.loads(p.read_text())


def _outcomes(score: dict[str, Any]) -> dict[str, tuple[str, str, Any]]:
    """id -> (kind, result, outcome) of every scored prediction."""
    return {s["id"]: (s["kind"], s["result"], s["outcome"]) for f in score["scores"] for s in f["scored"]}


#: Prediction kinds about what the rule decides (a state, a flag, an arm's condition, a verdict):
#: the emulator must give the simulator's outcome. Value and closest predictions compare a
#: measured number with a tolerance; an emulator at a high time scale measures slightly different
#: numbers from the simulator's, so those are reported side by side, and must all be scored.
RULE_KINDS = ("call", "probability", "categorical", "rule_probability")


def _verification(work: Path, testdir: str, env: dict[str, str]) -> dict[str, Any]:
    r = subprocess.run(
        [str(work / ".venv" / "bin" / "agentload"), "provenance", "verify", testdir, "--json"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.mark.timeout(900)
def test_the_tutorial_runs_as_written_and_agrees_with_the_simulator(tmp_path: Path, record_property: Any) -> None:
    from support.browser_check import find_chromium

    browser = find_chromium() is not None
    if not browser and os.environ.get("AGENTLOAD_SKIP_BROWSER") != "1":
        pytest.fail(
            "no Chromium: run scripts/setup-chromium.sh (Debian package chromium), or set AGENTLOAD_SKIP_BROWSER=1"
        )
    blocks = tutorial_blocks(DOC.read_text(encoding="utf-8"))
    commands = "\n".join(c for _, c in blocks)
    assert INSTALL_LINE in commands, f"{DOC}: the install line the test replaces is not on the page any more"
    for needed in (
        "agentload calibrate all",
        "agentload prereg fill",
        "git push",
        "agentload predict freeze",
        "agentload submit",
        "agentload jobs collect",
        "agentload analyze --registration",
        "agentload predict score",
        "agentload provenance verify",
        "agentload report",
        "agentload status",
    ):
        assert needed in commands, f"{DOC}: no `{needed}` among the page's commands"

    t_start = time.monotonic()
    home, folder = tmp_path / "home", tmp_path / "newcomer"
    home.mkdir()
    folder.mkdir()
    src = snapshot(tmp_path / "agentload-src")
    env = {**_git_env(home), "AGENTLOAD_REPO": str(src)}
    pip = os.environ.get("AGENTLOAD_TUTORIAL_PIP") == "1"
    script = tutorial_script(blocks, pip=pip, browser=browser, python=sys.executable)
    (tmp_path / "tutorial.sh").write_text(script)
    proc = subprocess.run(
        ["bash", str(tmp_path / "tutorial.sh")], cwd=folder, env=env, capture_output=True, text=True, timeout=840
    )
    log = proc.stdout + "\n--- stderr ---\n" + proc.stderr
    (tmp_path / "tutorial.log").write_text(log)
    times = stage_times(proc.stdout)
    print("\n".join(f"stage {s:<55} {t:7.1f} s" for s, t in times))
    record_property("stage_wall_s", json.dumps(times))
    assert proc.returncode == 0, (
        f"the tutorial's commands failed (exit {proc.returncode}); the last output:\n{log[-6000:]}"
    )
    work = folder / "agentload"
    td = work / TESTDIR

    # what the page promised happened
    col = _json(td / "collection.json")
    assert col["complete"] and not col["not_completed"] and col["agreement"] == [], col
    assert col["label"]["label"] == "pre-registered", col["label"]
    acc = _json(td / "provenance" / "accounting.json")
    manifest = _json(td / "submission.json")
    rows = acc["rows"] if isinstance(acc, dict) else acc
    assert len(rows) == len(manifest["jobs"]) == 6 and all(r["state"] == "COMPLETED" for r in rows), rows
    for j in manifest["jobs"]:
        m = _json(td / j["run_dir"] / "meta.json")
        assert m["status"] == "COMPLETED" and m["engine_backend"] == "emulator" and m["plan_check"]["ok"], (
            j,
            m.get("status_reason"),
        )
    verdict = _json(td / "analysis" / "registered-verdict.json")
    assert verdict["registered"]["decisive"] and len(verdict["registered"]["runs_counted"]) == 6, verdict["registered"]
    page = td / "report.html"
    assert page.is_file() and page.stat().st_size > 50_000
    if browser:
        from support.browser_check import artifact_dir

        assert (td / "report.png").is_file() and (td / "report.png").stat().st_size > 10_000
        shot = artifact_dir() / "tutorial-report.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(td / "report.png", shot)
        record_property("screenshot", str(shot))
        print(f"screenshot: {shot}")
    assert (td / "predictions" / f"{TAG}.score.json").is_file()
    agree_with_the_simulator(work, env, verdict)
    print(f"total {time.monotonic() - t_start:.0f} s")


def agree_with_the_simulator(work: Path, env: dict[str, str], verdict: dict[str, Any]) -> None:
    """The oracle: the same registered test in the simulator, locally; verdict per rate,
    rule-level prediction outcomes and provenance verification must agree."""
    td = work / TESTDIR
    t0 = time.monotonic()
    oracle = ORACLE.format(reg=REG, simdir=SIMDIR, tag=TAG)
    venv_env = {**env, "PATH": f"{work / '.venv' / 'bin'}{os.pathsep}{env['PATH']}"}
    r = subprocess.run(
        [str(work / ".venv" / "bin" / "python"), "-c", oracle],
        cwd=work,
        env=venv_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"stage {'oracle: the same test in the simulator':<55} {time.monotonic() - t0:7.1f} s")
    sim = work / SIMDIR
    sim_verdict = _json(sim / "analysis" / "registered-verdict.json")

    def per_rate(v: dict[str, Any]) -> list[tuple[float, str]]:
        return [(r["rate"], r["verdict"]) for r in v["rates"]]

    def states(v: dict[str, Any]) -> dict[Any, Any]:
        return {(r["rate"], s): arms for r in v["rates"] for s, arms in r["seeds"].items()}

    print(
        f"verdict: SLURM/emulator {verdict['verdict']} {per_rate(verdict)} {states(verdict)}\n"
        f"         simulator      {sim_verdict['verdict']} {per_rate(sim_verdict)} {states(sim_verdict)}"
    )
    assert (verdict["verdict"], per_rate(verdict)) == (sim_verdict["verdict"], per_rate(sim_verdict))
    assert verdict["verdict"] == "PASS" and len(sim_verdict["registered"]["runs_counted"]) == 6, sim_verdict[
        "registered"
    ]
    here, there = (
        _outcomes(_json(td / "predictions" / f"{TAG}.score.json")),
        _outcomes(_json(sim / "predictions" / f"{TAG}.score.json")),
    )
    print("predictions (id, kind: SLURM/emulator result and outcome | simulator result and outcome):")
    for pid in sorted(set(here) | set(there)):
        (k, r1, o1), (_, r2, o2) = here.get(pid, ("?", "-", None)), there.get(pid, ("?", "-", None))
        print(f"  {pid:<40} {k:<16} {r1:<5} {o1!s:<24} | {r2:<5} {o2!s:<24}{'' if r1 == r2 else '  <- differs'}")
    assert set(here) == set(there) and len(here) > 0
    assert all(r not in ("no outcome",) for _, r, _ in [*here.values(), *there.values()]), (
        "a prediction found no outcome"
    )
    rule_level = {pid: (v[0], v[1]) for pid, v in here.items() if v[0] in RULE_KINDS}
    assert rule_level and rule_level == {pid: (v[0], v[1]) for pid, v in there.items() if v[0] in RULE_KINDS}
    same = sum(here[p][1] == there[p][1] for p in here)
    print(f"  {same} of {len(here)} predictions scored alike; every rule-level one ({len(rule_level)}) alike")
    v_here, v_there = _verification(work, TESTDIR, venv_env), _verification(work, SIMDIR, venv_env)
    breaks = [[c for c in v["checks"] if not c["ok"]] for v in (v_here, v_there)]
    assert v_here["ok"] and v_there["ok"] and breaks == [[], []], breaks
    # The label is computed from each directory's own records: the SLURM submission asked the remote
    # before its first job; the oracle's runs have no submission (no question to the remote recorded),
    # so their label is at most "registered". Only the submitted test's label is the tutorial's.
    assert v_here["label"] == "pre-registered", v_here["label"]
    print(
        f"provenance: SLURM/emulator holds ({len(v_here['checks'])} checks, label {v_here['label']}), "
        f"simulator holds ({len(v_there['checks'])} checks, label {v_there['label']}: no submission recorded)"
    )
