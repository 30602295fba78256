"""The differential suite: every trace of a suite through one real engine's code and our model.

One driver process serves the whole suite (the engine's import is the slow part: ~20-40 s for
vLLM on a shared 2-core machine); each trace re-initialises the driver's scheduler with the
trace's engine shape.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from sim2real.differential import TraceResult, run_trace, summarize
from sim2real.engineproc import EngineProc
from sim2real.models import fake_model_dir
from sim2real.ours import OurEngine, OurRadixEngine, sglang_cell, vllm_cell
from sim2real.traces import TraceSpec, default_suite, make_trace


class DriverSide:
    """The real engine behind the differential runner's `Side` interface."""

    def __init__(self, proc: EngineProc) -> None:
        self.proc = proc

    def add(self, rid: str, prompt: list[int], max_tokens: int, output: list[int]) -> None:
        self.proc.call("add", id=rid, prompt=prompt, max_tokens=max_tokens, output=output)

    def step(self) -> dict[str, Any]:
        return self.proc.call("step")

    def flush(self) -> bool:
        return bool(self.proc.call("flush")["ok"])


class OurSide:
    def __init__(self, eng: OurEngine) -> None:
        self.eng = eng

    def add(self, rid: str, prompt: list[int], max_tokens: int, output: list[int]) -> None:
        self.eng.add(rid, prompt, max_tokens)

    def step(self) -> dict[str, Any]:
        return self.eng.step()

    def flush(self) -> bool:
        return self.eng.flush()


def _init_fields(engine: str, spec: TraceSpec, model: str) -> dict[str, Any]:
    e = spec.engine
    if engine == "vllm":
        return {
            "model": model,
            "num_blocks": e.num_blocks,
            "block_size": e.block_size,
            "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "max_model_len": e.max_model_len,
            "prefix_caching": spec.prefix_caching,
        }
    return {
        "model": model,
        "pool_tokens": e.pool_tokens,
        "page_size": 1,
        "chunked_prefill": e.max_num_batched_tokens,
        "max_running": e.max_num_seqs,
        "context_length": e.max_model_len,
        "prefix_caching": spec.prefix_caching,
        "schedule_policy": spec.schedule_policy,
    }


def _our_engine(engine: str, spec: TraceSpec, seed: int) -> Any:
    if engine == "vllm":
        return OurEngine(vllm_cell(spec.engine, prefix_cache=spec.prefix_caching), seed=seed)
    return OurRadixEngine(
        sglang_cell(spec.engine, prefix_cache=spec.prefix_caching, policy=spec.schedule_policy), seed=seed
    )


def run_suite(
    engine: str,
    specs: list[TraceSpec] | None = None,
    *,
    python: str | None = None,
    model_dir: str | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Run `specs` (default: the default suite) through `engine`'s own code and our model.

    engine: 'vllm' (V1 scheduler, KV cache manager, block pool) or 'sglang' (radix cache,
    schedule policy, prefill adder, schedule batch)."""
    specs = default_suite() if specs is None else specs
    if engine == "vllm":
        specs = [s for s in specs if s.schedule_policy == "fcfs"]  # vLLM has no cache-aware policy
    model = model_dir or fake_model_dir()
    results: list[TraceResult] = []
    t0 = time.monotonic()
    info: dict[str, Any] = {}
    with EngineProc(engine, python) as proc:
        for spec in specs:
            info = proc.call("init", **_init_fields(engine, spec, model))
            ours = _our_engine(engine, spec, seed)
            results.append(run_trace(make_trace(spec), DriverSide(proc), OurSide(ours), ours.outputs))
    out = summarize(results)
    out["engine"] = {"name": engine, **{k: v for k, v in info.items() if k != "ok"}}
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def write_report(summary: dict[str, Any], out_dir: Path | str) -> Path:
    """JSON of every trace plus a Markdown table of the agreement rates."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "differential.json").write_text(json.dumps(summary, indent=1))
    lines = [
        f"# Differential test: {summary['engine']['name']} {summary['engine'].get('version')} against the engine model",
        "",
        "| decision | agree | compared | rate |",
        "| --- | ---: | ---: | ---: |",
    ]
    for k, t in summary["overall"].items():
        rate = "-" if t["rate"] is None else f"{t['rate']:.4f}"
        lines.append(f"| {k} | {t['agree']} | {t['total']} | {rate} |")
    lines += ["", "Per trace family (rate, compared):", ""]
    kinds = list(summary["overall"])
    lines.append("| family | " + " | ".join(kinds) + " |")
    lines.append("| --- | " + " | ".join("---:" for _ in kinds) + " |")
    for fam, tallies in summary["families"].items():
        cells = []
        for k in kinds:
            t = tallies[k]
            cells.append("-" if t["rate"] is None else f"{t['rate']:.3f} ({t['total']})")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    path = out / "differential.md"
    path.write_text("\n".join(lines) + "\n")
    return path
