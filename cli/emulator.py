"""`agentload emulator serve`: the engine model served over SGLang's or vLLM's HTTP API (harness/emulator/serve.py)."""

from __future__ import annotations

import argparse

from cli.commands import CLI
from harness.emulator import serve
from harness.emulator.serve import add_serve_arguments, cmd_serve


def register(cli: CLI) -> None:
    """Add `agentload emulator serve`."""
    p = cli.command("emulator", group="execute", help="serve the engine model over SGLang's or vLLM's HTTP API")
    sub = p.add_subparsers(dest="emulator_command", metavar="ACTION")
    s = sub.add_parser(
        "serve",
        help="start an emulated engine server",
        description=serve.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_arguments(s)
    s.set_defaults(func=cmd_serve)
    p.set_defaults(_parser=p)
