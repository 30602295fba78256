"""The speed pin with a probe shaped like the workload's all-miss turns (exploratory; docs/cpu-trap.md).

The cell vllm-cpu-tiny-65k pins its engine's speed with 640-token probes (64 in flight, 4 tokens
out) aimed at 21,000 uncached tokens/s, the speed that probe read at 0.5 CPU on the AVX-512 host
that calibrated it. In fp32 on an AVX2-only CPU that pin holds the probe's speed but not the
trapped state's: BURST served 0.83-0.89 of the registered all-miss token rate, where the rule
allows 0.85-1.15. This script replaces the probe with prompts of the workload's mean turn length
(L_k = first_prompt + (tool_tokens + decode_tokens) (k - 1), averaged over turns under the turn
law; 1,240 tokens for cpu-scaled), the workload's decode length, and the registration's own
all-miss token rate as the target, so that the quantity the rule compares is the one pinned:

    python benchmarks/pin_probe_shape.py arm burst --out DIR    # CI's plan (seed 1 at 1.25), the registered rule
    python benchmarks/pin_probe_shape.py arm noburst --out DIR
    python benchmarks/pin_probe_shape.py e0a --out DIR          # E0a under that pin, as the registered one was made

Everything else is the registration's (plans, rule, references, cell); the runs are exploratory,
bound to no registration. In fp32 where the CPU lacks AVX-512 BF16 (harness/servers/cpudtype.py),
else as the cell launches. Needs AGENTLOAD_VLLM_PYTHON and AGENTLOAD_TINY_MODEL
(`eval "$(scripts/ci-engine-tests.sh --print-env)"`). Prints the judged state and statistics of an
arm, or E0a's lambda_ref and all-miss token rate per seed, with the pin's probes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.calibration_summaries import E0a, load_summary  # noqa: E402
from analysis.paired import paired_run  # noqa: E402
from analysis.staged_analysis import run_quantities  # noqa: E402
from harness.config import TestBundle, WorkloadConfig  # noqa: E402
from harness.servers.cpudtype import FP32_ARGS, slow_bf16  # noqa: E402
from harness.workload import draws  # noqa: E402
from prereg.registration import load_registration  # noqa: E402
from runs.arms import execute_run  # noqa: E402
from runs.closed_runs import e0a  # noqa: E402
from runs.cpu_launch import LaunchError, engine_env, run_options  # noqa: E402
from runs.realrun import EngineOptions  # noqa: E402

REG = ROOT / "prereg" / "registrations" / "e2-vllm-cpu-tiny-65k-quarter.yaml"


def mean_turn_prompt(w: WorkloadConfig) -> float:
    """The workload's prompt length L_k averaged over turns (harness.workload.draws.mean_turn_prompt),
    for the capped geometric turn law its G_k = P(T >= k) stands for."""
    if w.turns.law != "capped_geometric":
        raise SystemExit(f"workload {w.name}: turn law {w.turns.law!r}; this script knows capped_geometric")
    return draws.mean_turn_prompt(w)


def shaped_bundle(prompt_tokens: int | None) -> tuple[Any, TestBundle, int]:
    """The registration, its bundle with the cell's pin probe replaced, and the probe's prompt length."""
    reg = load_registration(REG)
    b = reg.bundle()
    assert b.cell.engine_speed_pin is not None
    prompt = prompt_tokens or round(mean_turn_prompt(b.workload))
    pin = b.cell.engine_speed_pin.model_copy(
        update={
            "token_rate": reg.references.all_miss_token_rate,
            "prompt_tokens": prompt,
            "max_tokens": b.workload.decode_tokens,
            "requests": 96,
            "concurrency": 64,
            "source": "exploratory (benchmarks/pin_probe_shape.py): the workload's mean turn, at the registered "
            "all-miss token rate",
        }
    )
    cell = b.cell.model_copy(update={"engine_speed_pin": pin})
    return reg, dataclasses.replace(b, cell=cell), prompt


def _pin(meta: dict[str, Any]) -> dict[str, Any]:
    p = meta.get("engine_speed_pin") or {}
    return {
        "quota": p.get("quota"),
        "ratio": p.get("ratio"),
        "probes": [(s["quota"], round(s["token_rate"])) for s in p.get("steps", [])],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("arm", "e0a"))
    ap.add_argument("arm", nargs="?", choices=("burst", "noburst", "capped"), help="with `arm`: which")
    ap.add_argument("--out", required=True, help="run directory (arm) or folder of runs (e0a)")
    ap.add_argument("--prompt-tokens", type=int, help="the probe's prompt length (default: the workload's mean turn)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=1.25, help="a registered multiple")
    args = ap.parse_args(argv)
    try:
        python, model = engine_env()
    except LaunchError as exc:
        raise SystemExit(str(exc)) from None
    extra = tuple(FP32_ARGS) if slow_bf16() else ()
    reg, bundle, prompt = shaped_bundle(args.prompt_tokens)
    refs = {"lambda_ref": reg.references.lambda_ref, "all_miss_token_rate": reg.references.all_miss_token_rate}
    out = Path(args.out)
    head = {"probe_prompt_tokens": prompt, "target": reg.references.all_miss_token_rate, "engine_args": list(extra)}
    if args.what == "arm":
        if args.arm is None:
            ap.error("arm: say which (burst, noburst, capped)")
        res = execute_run(
            bundle, args.arm, args.rate, args.seed, "vllm", out, options=run_options(python, model, extra_args=extra)
        )
        if res.status != "COMPLETED":
            print(json.dumps({**head, "status": res.status, "reason": res.reason}, indent=1))
            return 1
        av = paired_run(reg.rule, run_quantities(out, reg.rule, refs_override=refs, series=False).run)
        keep = ("hit", "token_ratio", "slope", "slope_threshold", "hit_last", "outstanding_last")
        doc = {**head, "arm": args.arm, "state": av["state"], "stats": {k: av["stats"].get(k) for k in keep}}
        print(json.dumps({**doc, "pin": _pin(json.loads((out / "meta.json").read_text()))}, indent=1, default=str))
        return 0
    # the registered E0a's population, seeds and times, from the input the registration binds
    bound = reg.bound_input("e0a")
    if bound is None:
        raise SystemExit(f"registration {reg.name}: no bound E0a input")
    made = load_summary(bound[0], "e0a")
    assert isinstance(made, E0a)
    p = made.protocol
    per_seed: list[Any] = []
    s = e0a(
        bundle.cell,
        bundle.workload,
        seeds=[r.seed for r in made.per_seed],
        n=p.n,
        check_n=None,
        out_dir=out,
        warmup=p.warmup_s,
        window=p.window_s,
        engine=EngineOptions(**run_options(python, model, extra_args=extra)),
        runs=per_seed,
    )
    pins = [_pin(json.loads(m.read_text())) for m in sorted(out.glob("*/meta.json"))]
    doc = {**head, "e0a": s.as_dict(), "per_seed": [r.as_dict() for r in per_seed], "pins": pins, "registered": refs}
    print(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
