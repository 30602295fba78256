"""The registered paired test on the real CPU vLLM, end to end: calibrate, fill, register, run, score.

    python benchmarks/cpu_trap.py all --out results/cpu-trap          # everything, in order
    python benchmarks/cpu_trap.py calibrate|costs|design|fill|register|run|score --out results/cpu-trap
    python benchmarks/cpu_trap.py ... --cell vllm-cpu-tiny-65k          # the speed-pinned cell

Why a script: the paper needed A100s to show the trap; the cell vllm-cpu-tiny-131k shows the same
thrashing curve on a 2-core CPU (vLLM 0.32 CPU serving the tiny model), so the whole registered
lifecycle can be watched on any machine in about two hours. Each step is the command a user would
type (`agentload calibrate all`, `prereg fill`, `prereg check`, `run --registration`, `analyze
--registration`); the script only strings them together, times them and records the host's load
beside each one (results/cpu-trap/steps.jsonl), since on a shared CPU the engine runs as fast as
the cores it is left.

Steps:
1. calibrate: Stage C (n = 16 ... 256), E0a (cache off, n = 128, seeds 0-2, check n = 256) and E0b
   (protocol e0b-cpu, multiples 1.25 ... 3.0 of the λ_ref E0a measured, top rate 40 sessions/s):
   every closed run is the paper's 900 s + 1800 s divided by 50; one fresh server per run.
   The summaries go to prereg/inputs/vllm-cpu-tiny-131k/ (the registration's inputs), the run
   records under OUT/calibration/. `--resume` keeps completed runs of a stage that died.
   costs, design (a cell with a fitted cost file, --cell vllm-cpu-tiny-65k): `calibrate costs` from
   the E0a runs and Stage C n = 16, then `prereg design` (is every arm's outcome reachable; the
   record goes to the inputs folder as design.yaml, which the fill binds).
2. fill: `prereg fill` with prereg/templates/e2-vllm-cpu-tiny-131k.yaml ->
   prereg/registrations/e2-vllm-cpu-tiny-131k.yaml (a pure function of the inputs).
3. register: commit the inputs and the registration (`--commit`), then `prereg check`; the
   label the runs get follows from git (pre-registered only once the commit is on a remote).
4. run: every arm x rate x seed of the registration, one at a time, each on a fresh server. The
   SLURM submission command (`agentload submit`) is not in this tree yet, so the runs are made
   directly with `agentload run --registration`, which binds each run to the registration just as
   a job would; a completed run directory is kept on a rerun.
5. score: `agentload analyze --registration` over the run directories -> OUT/verdict/.

Needs AGENTLOAD_VLLM_PYTHON (the engine venv's python) and AGENTLOAD_TINY_MODEL (the tiny model),
as `eval "$(scripts/ci-engine-tests.sh --print-env)"` sets them; AGENTLOAD_ENGINE_CACHE is passed
on when set. Runs the harness from the interpreter running this script.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CELL = "vllm-cpu-tiny-131k"
WORKLOAD = "cpu-scaled"
INPUTS = Path("prereg/inputs") / CELL
TEMPLATE = Path("prereg/templates/e2-vllm-cpu-tiny-131k.yaml")
REGISTRATION = Path("prereg/registrations/e2-vllm-cpu-tiny-131k.yaml")
COST: Path | None = None  # the cell's fitted cost file, which the design step simulates with

# The calibration of the scaled cell, as data: the paper's stages with every time divided by
# k = 50 (as protocols/e2-cpu.yaml) and the populations of E0a and E0b's thresholds multiplied by
# the ratio of the caps (64 / 20). Stage C spans the rising branch, the peak near the running cap
# and the collapse past the pool (the 0.5-hit crossing was near n = 91 on an idle host, past 128
# on a loaded one). E0a runs at twice the running cap and checks at four times: at n = 64 a
# cache-off engine with multi-second turns is left short of a full batch by the sessions in their
# tool calls (on the loaded host the n = 128 check ran 1.5x the turns of n = 64), so n = 64 would
# understate the all-miss capacity and put the registered rates below it.
CALIBRATION: dict[str, Any] = {
    "n": [16, 32, 48, 64, 96, 128, 256],
    "warmup": 18.0,
    "window": 36.0,
    "e0a_n": 128,
    "check_n": 256,
    "e0a_seeds": [0, 1, 2],
    "e0b_protocol": "e0b-cpu",
    "grid": [1.25, 1.5, 1.75, 2.0, 2.5, 3.0],
    "final_max": 160.0,
    "rise_max": 32.0,
    "top_rate": 40.0,
}

# The speed-pinned cell (docs/cpu-trap.md): a 65,536-token pool, at most 32 running; E0a at twice
# the running cap, E0b's population thresholds x the cap ratio 32 / 20.
PINNED: dict[str, Any] = {
    "cell": "vllm-cpu-tiny-65k",
    "template": Path("prereg/templates/e2-vllm-cpu-tiny-65k.yaml"),
    "registration": Path("prereg/registrations/e2-vllm-cpu-tiny-65k.yaml"),
    "cost": Path("configs/costs/vllm-cpu-tiny-65k-fitted.yaml"),
    "calibration": {
        **CALIBRATION,
        "n": [8, 16, 24, 32, 48, 64, 96, 128],
        "e0a_n": 64,
        "check_n": 128,
        "final_max": 80.0,
        "rise_max": 16.0,
    },
}


def use_cell(name: str) -> None:
    """Point the steps at another CPU cell's files (--cell)."""
    global CELL, INPUTS, TEMPLATE, REGISTRATION, COST, CALIBRATION
    if name == CELL:
        return
    if name != PINNED["cell"]:
        sys.exit(f"cpu_trap: --cell {name}: expected {CELL} or {PINNED['cell']}")
    CELL, INPUTS, TEMPLATE, REGISTRATION = (
        name,
        Path("prereg/inputs") / name,
        PINNED["template"],
        PINNED["registration"],
    )
    COST, CALIBRATION = PINNED["cost"], PINNED["calibration"]


def engine_options() -> list[str]:
    """The real-engine options of every calibrate / run command (runs/cpu_launch.py)."""
    from runs.cpu_launch import LaunchError, cli_options, engine_env

    try:
        return [*cli_options(*engine_env()), "--progress-every", "60"]
    except LaunchError as exc:
        sys.exit(f"cpu_trap: {exc} (it installs the CPU vLLM and builds the tiny model)")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


class Steps:
    """Runs each command, timing it and recording the load averages before and after (steps.jsonl)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.log = out / "steps.jsonl"

    def run(self, name: str, argv: list[str], *, check: bool = True) -> int:
        t0, load0 = time.time(), loadavg()
        print(f"[cpu_trap] {name}: {shlex.join(argv)}  (load {load0})", flush=True)
        rc = subprocess.run(argv, cwd=ROOT).returncode
        rec = {
            "step": name,
            "argv": argv,
            "rc": rc,
            "started": t0,
            "wall_s": round(time.time() - t0, 1),
            "loadavg_before": load0,
            "loadavg_after": loadavg(),
            "cpus": os.cpu_count(),
        }
        with self.log.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"[cpu_trap] {name}: rc {rc} in {rec['wall_s']:.0f} s (load {rec['loadavg_after']})", flush=True)
        if check and rc != 0:
            sys.exit(f"cpu_trap: step {name} failed (rc {rc}); see the output above and {self.log}")
        return rc


def agentload(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def calibrate(steps: Steps, args: argparse.Namespace) -> None:
    c = CALIBRATION
    argv = agentload(
        "calibrate",
        "all",
        "--cell",
        CELL,
        "--workload",
        WORKLOAD,
        "--out",
        str(INPUTS),
        "--runs-dir",
        str(steps.out / "calibration"),
        "--n",
        ",".join(map(str, c["n"])),
        "--warmup",
        str(c["warmup"]),
        "--window",
        str(c["window"]),
        "--e0a-n",
        str(c["e0a_n"]),
        "--check-n",
        str(c["check_n"]),
        "--e0a-seeds",
        ",".join(map(str, c["e0a_seeds"])),
        "--e0b-protocol",
        c["e0b_protocol"],
        "--grid",
        ",".join(map(str, c["grid"])),
        "--final-max",
        str(c["final_max"]),
        "--rise-max",
        str(c["rise_max"]),
        "--top-rate",
        str(c["top_rate"]),
        *engine_options(),
    )
    if args.resume:
        argv.append("--resume")
    steps.run("calibrate", argv)


def costs(steps: Steps, args: argparse.Namespace) -> None:
    """`calibrate costs` from the calibration's E0a runs and its Stage C run at the running cap's half
    (as the first CPU cell's fit): the cost model the design step simulates with."""
    if COST is None:
        return
    c = CALIBRATION
    runs = [steps.out / "calibration" / f"e0a-n{c['e0a_n']}-s{s}" for s in c["e0a_seeds"]] + [
        steps.out / "calibration" / "stage-c-n16-s0"
    ]
    steps.run(
        "costs",
        agentload(
            "calibrate",
            "costs",
            "--cell",
            CELL,
            "--workload",
            WORKLOAD,
            "--engine",
            "vllm",
            "--from-runs",
            *map(str, runs),
            "--name",
            COST.stem,
            "--out",
            str(COST),
        ),
    )


def design(steps: Steps, args: argparse.Namespace) -> None:
    """`prereg design` on the calibration and the template.

    Its record goes beside the inputs, where the fill binds it.
    """
    if COST is None:
        sys.exit(f"cpu_trap: {CELL} has no fitted cost file for the design step (agentload calibrate costs fits one)")
    steps.run(
        "design",
        agentload(
            "prereg",
            "design",
            "--inputs",
            str(INPUTS),
            "--test",
            str(TEMPLATE),
            "--cost",
            str(COST),
            "--overhead",
            "75",
            "--max-ci-minutes",
            "5",
            "--no-search",
            "--out",
            str(INPUTS / "design.yaml"),
        ),
    )


def fill(steps: Steps, args: argparse.Namespace) -> None:
    steps.run(
        "fill",
        agentload("prereg", "fill", "--inputs", str(INPUTS), "--test", str(TEMPLATE), "--out", str(REGISTRATION)),
    )


def register(steps: Steps, args: argparse.Namespace) -> None:
    if args.commit:
        steps.run("git-add", ["git", "add", str(INPUTS), str(REGISTRATION)])
        staged = subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=ROOT).returncode != 0
        if staged:
            steps.run(
                "git-commit",
                [
                    "git",
                    "commit",
                    "-m",
                    f"Calibration inputs and filled registration of {CELL} (benchmarks/cpu_trap.py)",
                ],
            )
    steps.run("check", agentload("prereg", "check", str(REGISTRATION)), check=False)


def planned(reg_path: Path) -> list[tuple[str, float, int]]:
    """Every registered arm x rate x seed, seed by seed and rate by rate with the arms side by side,
    so a drift of the host's load over the test falls on the arms alike."""
    from prereg.registration import load_registration

    reg = load_registration(ROOT / reg_path)
    return [(a, m, s) for s in reg.seeds for m in reg.multiples() for a in reg.arms]


def _completed(run_dir: Path) -> bool:
    try:
        return json.loads((run_dir / "meta.json").read_text()).get("status") == "COMPLETED"
    except (OSError, ValueError):
        return False


def run(steps: Steps, args: argparse.Namespace) -> None:
    runs = steps.out / "runs"
    todo = planned(REGISTRATION)
    if args.arms:
        todo = [t for t in todo if t[0].lower() in {a.lower() for a in args.arms.split(",")}]
    if args.rates:
        todo = [t for t in todo if any(abs(t[1] - float(r)) < 1e-9 for r in args.rates.split(","))]
    if args.seeds:
        todo = [t for t in todo if t[2] in {int(s) for s in args.seeds.split(",")}]
    for arm, rate, seed in todo:
        rd = runs / f"{arm.lower()}-r{rate:.2f}-s{seed}"
        if _completed(rd):
            print(f"[cpu_trap] {rd.name}: completed before, kept", flush=True)
            continue
        if rd.exists():
            rd.rename(rd.with_name(f"{rd.name}.failed-{int(time.time())}"))
        steps.run(
            f"run {rd.name}",
            agentload(
                "run",
                "--registration",
                str(REGISTRATION),
                "--arm",
                arm,
                "--rate",
                str(rate),
                "--seed",
                str(seed),
                "--out",
                str(rd),
                *engine_options(),
            ),
            check=False,
        )


def score(steps: Steps, args: argparse.Namespace) -> None:
    steps.run(
        "score",
        agentload(
            "analyze", "--registration", str(REGISTRATION), str(steps.out / "runs"), "--out", str(steps.out / "verdict")
        ),
        check=False,
    )


STEPS = {
    "calibrate": calibrate,
    "costs": costs,
    "design": design,
    "fill": fill,
    "register": register,
    "run": run,
    "score": score,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("step", choices=[*STEPS, "all"])
    p.add_argument(
        "--out", default="results/cpu-trap", help="run records, step log and verdict (default results/cpu-trap)"
    )
    p.add_argument(
        "--cell", default=CELL, help=f"{CELL} (the first registered CPU test) or {PINNED['cell']} (speed-pinned)"
    )
    p.add_argument("--resume", action="store_true", help="calibrate: keep completed calibration runs")
    p.add_argument("--commit", action="store_true", help="register: git-commit the inputs and the registration first")
    p.add_argument("--arms", help="run: only these arms (comma-separated)")
    p.add_argument("--rates", help="run: only these registered multiples (comma-separated)")
    p.add_argument("--seeds", help="run: only these seeds (comma-separated)")
    args = p.parse_args(argv)
    use_cell(args.cell)
    steps = Steps(Path(args.out) if Path(args.out).is_absolute() else ROOT / args.out)
    t0 = time.time()
    for name in STEPS if args.step == "all" else [args.step]:
        STEPS[name](steps, args)
    print(f"[cpu_trap] {args.step}: {time.time() - t0:.0f} s wall in all; step log {steps.log}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
