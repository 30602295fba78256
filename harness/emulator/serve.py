"""The emulator's server process: `python -m harness.emulator serve ...` (and `agentload emulator serve`).

It is launched exactly like a real engine (by the emulator adapter, in its own process group, with
its log in the run directory), so that crash, port and health handling are the same code paths.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys

from harness.config import CellConfig, load_config
from harness.emulator.server import Emulator, Faults, serve
from harness.errors import ConfigError


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cell", required=True, help="cell config (name under configs/cells or a path)")
    p.add_argument(
        "--flavor", choices=("sglang", "vllm"), default=None, help="API dialect (default: the cell's engine)"
    )
    p.add_argument("--time-scale", type=float, default=1.0, help="engine seconds per wall second (default 1)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--served-model-name", default=None, help="model name in responses and /v1/models (default: the cell's model)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="KIND[:N]",
        help="TEST-ONLY failure injection: die-after:N, 5xx:N, malformed:N, no-usage:N, hang:N, unhealthy",
    )
    p.add_argument("--log-level", default="INFO")


def load_cell(ref: str) -> CellConfig:
    name = ref if ("/" in ref or ref.endswith((".yaml", ".yml"))) else f"cells/{ref}"
    return load_config(name, CellConfig)


async def _serve_forever(args: argparse.Namespace) -> int:
    cell = load_cell(args.cell)
    emu = Emulator(
        cell,
        flavor=args.flavor,
        time_scale=args.time_scale,
        model_name=args.served_model_name or cell.model,
        seed=args.seed,
        faults=Faults.parse(args.fault),
    )
    try:
        runner, url = await serve(emu, args.host, args.port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            print(f"agentload emulator: port {args.port} on {args.host} is already in use", file=sys.stderr)
            return 3
        raise
    logging.getLogger("agentload.emulator").info(
        "serving %s (%s flavour, time scale %g) at %s", cell.name, emu.flavor, emu.time_scale, url
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_serve_forever(args))
    except (ConfigError, ValueError) as exc:
        print(f"agentload emulator: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.emulator [emulator] serve ...`: the leading word is accepted so that the
    adapter's `--server-cmd` prefix can stand in for `agentload`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["emulator"]:
        argv = argv[1:]
    parser = argparse.ArgumentParser(prog="python -m harness.emulator")
    sub = parser.add_subparsers(dest="action", required=True)
    s = sub.add_parser("serve")
    add_serve_arguments(s)
    args = parser.parse_args(argv)
    return cmd_serve(args)
