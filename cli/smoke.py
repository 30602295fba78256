"""`agentload smoke`: Stage 0 against a server the command launches from the cell, or one already running."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

from cli.commands import CLI
from harness.config import CellConfig, SpeedPin, config_ref, load_config
from harness.errors import UsageError
from harness.servers import cpuquota
from harness.servers.base import EngineAdapter
from harness.servers.portstart import start_on_free_port
from harness.servers.registry import get_adapter
from harness.servers.smoke import WORKLOAD_MAX_PROMPT, run_smoke_blocking
from harness.servers.speedpin import measure_blocking
from harness.servers.vllm import private_cache_env


def register(cli: CLI) -> None:
    """Add `agentload smoke`."""
    p = cli.command(
        "smoke",
        group="execute",
        help="Stage 0: check an engine server against a cell (flags, cache reporting, pool, flush)",
    )
    p.add_argument("--engine", required=True, help="sglang | vllm | emulator (emulator:sglang, emulator:vllm)")
    p.add_argument("--cell", required=True, help="cell config (path or name under configs/cells)")
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--server-cmd",
        help="launcher prefix to which the cell's flags are appended, e.g. '/opt/vllm/bin/python -m "
        "vllm.entrypoints.openai.api_server'",
    )
    src.add_argument("--base-url", help="check an already running server instead of launching one")
    p.add_argument("--model-path", "--model", dest="model", help="weights the engine loads (default: the cell's model)")
    p.add_argument("--flavor", choices=("sglang", "vllm"), help="emulator dialect (default: the cell's engine)")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulator time scale")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = a free port")
    p.add_argument(
        "--engine-arg",
        "--server-arg",
        dest="engine_arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra server argument(s), shell-split (repeatable): --engine-arg='--dtype bfloat16'",
    )
    p.add_argument(
        "--run-dir",
        type=Path,
        default=None,
        help="where the server log and smoke.json go (default results/smoke/smoke-<time>)",
    )
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--long-prompt", type=int, default=WORKLOAD_MAX_PROMPT)
    p.add_argument("--decode-tokens", type=int, default=100)
    p.add_argument(
        "--cache-dir", type=Path, default=None, help="private folder for the engine's compile caches and temp files"
    )
    p.add_argument(
        "--probe-quotas",
        default=None,
        metavar="Q1,Q2,...",
        help="after the checks, the speed pin's probe (the cell's engine_speed_pin shape, else the default) at each "
        "CPU quota: what a cell's engine_speed_pin.token_rate is measured with (needs a cell with "
        "engine_cpu_quota)",
    )
    p.add_argument("--probe-repeats", type=int, default=3, help="probes per quota (default 3)")
    p.set_defaults(func=_cmd_smoke)


def _cmd_smoke(args: argparse.Namespace) -> int:
    cell = load_config(config_ref(args.cell, "cells"), CellConfig)
    adapter = get_adapter(
        args.engine,
        cell=cell,
        flavor=args.flavor,
        time_scale=args.time_scale,
        cell_ref=args.cell,
        server_cmd=shlex.split(args.server_cmd) if args.server_cmd else None,
    )
    run_dir = args.run_dir or Path("results") / "smoke" / time.strftime("smoke-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = None
    argv: list[str] | None = None
    base_url = args.base_url
    try:
        if base_url is None:
            extra = [tok for a in args.engine_arg for tok in shlex.split(a)]
            t0 = time.monotonic()
            handle, argv = start_on_free_port(
                adapter,
                cell,
                run_dir,
                model=args.model or cell.model,
                host=args.host,
                health_timeout=args.health_timeout,
                extra_args=extra,
                env=private_cache_env(args.cache_dir) if args.cache_dir is not None else None,
                port=args.port or None,
            )
            print(f"server healthy after {time.monotonic() - t0:.1f} s at {handle.base_url} (log {handle.log_path})")
            base_url = handle.base_url
        report = run_smoke_blocking(
            adapter,
            base_url.rstrip("/"),
            cell,
            model_name=adapter.served_model_name(cell),
            long_prompt=args.long_prompt,
            decode_tokens=args.decode_tokens,
            launched_argv=argv,
        )
        if args.probe_quotas:
            quotas = [float(x) for x in args.probe_quotas.split(",")]
            _probe_quotas(adapter, handle, cell, base_url.rstrip("/"), quotas, args.probe_repeats, run_dir)
    finally:
        if handle is not None:
            adapter.stop(handle)
    (run_dir / "smoke.json").write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    print(report.summary())
    print(f"report: {run_dir / 'smoke.json'}")
    return 0 if report.passed else 1


def _probe_quotas(
    adapter: EngineAdapter,
    handle: Any,
    cell: CellConfig,
    base_url: str,
    quotas: list[float],
    repeats: int,
    run_dir: Path,
) -> None:
    """The speed pin's probe at each quota (harness/servers/speedpin.py), printed and kept in probe.json."""
    group = getattr(handle, "cpu_group", None)
    if group is None:
        raise UsageError(
            "smoke --probe-quotas: the server must be launched here under a CPU quota (a cell with engine_cpu_quota)"
        )
    pin = cell.engine_speed_pin or SpeedPin(token_rate=1.0, max_cpu_quota=max(quotas), source="measurement")
    steps = measure_blocking(
        adapter, base_url, pin, adapter.served_model_name(cell), quotas, repeats, lambda q: cpuquota.apply(group, q)
    )
    print(f"speed probe ({pin.requests} prompts x {pin.prompt_tokens} tokens, {pin.max_tokens} out, at once):")
    for q in quotas:
        rates = [s.token_rate for s in steps if abs(s.quota - q) < 1e-6]
        print(
            f"  quota {q:g} CPU: {sum(rates) / len(rates):.0f} uncached tokens/s (runs "
            f"{', '.join(f'{r:.0f}' for r in rates)})"
        )
    (run_dir / "probe.json").write_text(json.dumps([s.__dict__ for s in steps], indent=2) + "\n")
