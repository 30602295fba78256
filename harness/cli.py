"""The `agentload` command.

How a module adds commands
--------------------------
Each module that owns a step of the data flow defines

    def register(cli: harness.cli.CLI) -> None:
        p = cli.command("run", group="execute", help="drive one run from a frozen plan")
        p.add_argument(...)
        p.set_defaults(func=_cmd_run)      # _cmd_run(args) -> int (exit status)

and is listed once in REGISTRARS below as "package.module:register". Modules are imported only
when the parser is built, so a command's heavy imports cost nothing to the others. `--help`
lists commands grouped by the data flow (GROUPS), in registration order within a group; a
command appears only once its module is registered, never as a placeholder.

Errors meant for the user (a malformed config, an impossible request) are raised as ConfigError,
CLIError or a class passed to `cli.user_errors(...)`; `main` prints their message as one paragraph
on stderr and exits with status 2, without a traceback. Anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Sequence

from harness.config import ConfigError

# The data flow: config -> plan -> calibration -> registration -> submission -> run -> verdict.
GROUPS: list[tuple[str, str]] = [
    ("workload", "Workload: freeze what the client will send"),
    ("calibrate", "Calibrate and register: measure the cell, fill and freeze registrations and predictions"),
    ("execute", "Execute: submit jobs, run arms, serve the emulator"),
    ("judge", "Judge: analyze runs into verdicts, prove provenance"),
]

REGISTRARS: list[str] = [
    "harness.workload.plans:register",
    "harness.protocols.calibration_cli:register",
    "harness.sim2real.cli:register",
    "prereg.cli:register",
    "slurm.cli:register",
    "harness.emulator.cli:register",
    "harness.servers.smoke:register",
    "harness.protocols.cli:register",
    "analysis.theory.cli:register",
    "prereg.predict_cli:register",
    "analysis.cli:register",
    "provenance.cli:register",
    "analysis.report_cli:register",
]


class CLIError(Exception):
    """Bad command-line input that argparse cannot see (a missing file, a contradictory option)."""


@dataclass(frozen=True)
class _Command:
    name: str
    group: str
    help: str


class CLI:
    """The parser under construction; handed to every module's register()."""

    def __init__(self) -> None:
        self.parser = argparse.ArgumentParser(
            prog="agentload",
            description="Registered, reproducible tests of prefix-cache collapse in LLM agent serving.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self._sub = self.parser.add_subparsers(dest="command", metavar="COMMAND")
        self._commands: list[_Command] = []
        self._user_errors: list[type[BaseException]] = [ConfigError, CLIError]

    def command(self, name: str, *, group: str, help: str, **kwargs: object) -> argparse.ArgumentParser:
        """Add a top-level command to a data-flow group and return its parser."""
        if group not in dict(GROUPS):
            raise ValueError(f"unknown command group {group!r}; expected one of {[g for g, _ in GROUPS]}")
        if any(c.name == name for c in self._commands):
            raise ValueError(f"command {name!r} registered twice")
        self._commands.append(_Command(name, group, help))
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        return self._sub.add_parser(name, description=help, **kwargs)  # type: ignore[arg-type]

    def user_errors(self, *types: type[BaseException]) -> None:
        """Declare exception classes whose message is for the user (printed, exit 2, no traceback)."""
        self._user_errors.extend(types)

    @property
    def error_types(self) -> tuple[type[BaseException], ...]:
        return tuple(self._user_errors)

    def finish(self) -> argparse.ArgumentParser:
        lines = ["commands, in the order data flows through them:"]
        width = max((len(c.name) for c in self._commands), default=0)
        for key, title in GROUPS:
            members = [c for c in self._commands if c.group == key]
            if not members:
                continue
            lines.append(f"\n  {title}")
            lines.extend(f"    {c.name:<{width}}  {c.help}" for c in members)
        lines.append("\nRun 'agentload COMMAND --help' for a command's options.")
        self.parser.epilog = "\n".join(lines)
        return self.parser


def build(registrars: Sequence[str] = REGISTRARS) -> CLI:
    cli = CLI()
    for ref in registrars:
        module, _, func = ref.partition(":")
        register: Callable[[CLI], None] = getattr(importlib.import_module(module), func)
        register(cli)
    cli.finish()
    return cli


def _paragraph(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text


def main(argv: Sequence[str] | None = None) -> int:
    cli = build()
    args = cli.parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        # a command group given without its action, or nothing at all
        sub_parser = getattr(args, "_parser", None)
        (sub_parser or cli.parser).print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except cli.error_types as exc:
        print(f"agentload: error: {_paragraph(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
