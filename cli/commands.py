"""The parser every command module adds its commands to (`register(cli: CLI)`), and the command table.

How a module adds commands
--------------------------
A module that owns a step of the data flow defines

    def register(cli: CLI) -> None:
        p = cli.command("run", group="execute", help="drive one run from a frozen plan")
        p.add_argument(...)
        p.set_defaults(func=_cmd_run)      # _cmd_run(args) -> int (exit status)

and the command is listed once in `COMMANDS` below with the module that registers it. The table is
what `agentload --help` prints, so it costs no import; `agentload CMD ...` imports only CMD's module
(a command's heavy imports cost nothing to the others). `cli.command` refuses a command whose name,
group or help differ from its row here, so the table cannot drift from the code
(tests/unit/harness/test_cli.py registers every module against it).

Errors meant for the user are `harness.errors.AgentloadError`s: `agentload` prints their message as
one paragraph and exits with status 2; anything else is a bug and keeps its traceback with --debug.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

# The data flow: config -> plan -> calibration -> registration -> submission -> run -> verdict.
GROUPS: list[tuple[str, str]] = [
    ("workload", "Workload: freeze what the client will send"),
    ("calibrate", "Calibrate and register: measure the cell, fill and freeze registrations and predictions"),
    ("execute", "Execute: submit jobs, run arms, serve the emulator"),
    ("judge", "Judge: analyze runs into verdicts, prove provenance"),
]


@dataclass(frozen=True)
class Command:
    """One top-level command: its name, data-flow group, one-line help and the module that registers it."""

    name: str
    group: str
    help: str
    module: str


COMMANDS: list[Command] = [
    Command("plan", "workload", "make a frozen session plan (Parquet + SHA-256), or show one", "cli.plan"),
    Command(
        "calibrate", "calibrate", "run a calibration stage (Stage C, E0a, E0b) or all three on a cell", "cli.calibrate"
    ),
    Command(
        "differential",
        "calibrate",
        "the engine model against a real engine's own scheduler and cache code",
        "cli.sim2real",
    ),
    Command(
        "prereg",
        "calibrate",
        "fill a registration by formula from calibration inputs; check one before submitting",
        "cli.prereg",
    ),
    Command("theory", "calibrate", "model F, the entry model's curve, plan-driven fluid", "cli.theory"),
    Command(
        "predict", "calibrate", "make prediction files, freeze them before the runs, score them after", "cli.predict"
    ),
    Command(
        "submit",
        "execute",
        "submit every arm x rate x seed of a registration as jobs (SLURM via submitit, or local)",
        "cli.submit",
    ),
    Command(
        "jobs",
        "execute",
        "scheduler states of a submission's jobs; collect their runs, accounting and verdict",
        "cli.submit",
    ),
    Command("emulator", "execute", "serve the engine model over SGLang's or vLLM's HTTP API", "cli.emulator"),
    Command(
        "smoke",
        "execute",
        "Stage 0: check an engine server against a cell (flags, cache reporting, pool, flush)",
        "cli.smoke",
    ),
    Command("run", "execute", "drive one arm x rate x seed of a test into a run directory", "cli.run"),
    Command("test", "execute", "run a whole test (every arm x rate x seed) and score it", "cli.run"),
    Command(
        "replay", "judge", "replay real runs in the simulator (their plan, arm, cell) and report parity", "cli.sim2real"
    ),
    Command(
        "analyze", "judge", "score run directories with a registered rule; write verdict, report, figure", "cli.analyze"
    ),
    Command(
        "provenance",
        "judge",
        "proofs of unchanged files, a test's timeline and labels, whole-test verification",
        "cli.provenance",
    ),
    Command(
        "evidence",
        "judge",
        "pack a registered test's evidence for the repository; check a bundle with no engine, cluster or git",
        "cli.evidence",
    ),
    Command(
        "status",
        "judge",
        "where a test stands: registration and label, predictions, jobs, runs bound, verdict, provenance breaks",
        "cli.status",
    ),
    Command(
        "report",
        "judge",
        "a test's report: the Markdown tables, or with --html one self-contained page for a reviewer",
        "cli.review",
    ),
]
BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}


class CLI:
    """The parser under construction; handed to every module's register()."""

    def __init__(self) -> None:
        self.parser = argparse.ArgumentParser(
            prog="agentload",
            description="Registered, reproducible tests of prefix-cache collapse in LLM agent serving.",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        self.parser.add_argument(
            "--debug", dest="debug_top", action="store_true", help="show the traceback of an internal error (a bug)"
        )
        self._sub = self.parser.add_subparsers(dest="command", metavar="COMMAND")
        self.registered: list[str] = []

    def command(self, name: str, *, group: str, help: str) -> argparse.ArgumentParser:
        """Add a top-level command and return its parser; it must match its row in COMMANDS."""
        row = BY_NAME.get(name)
        if row is None or row.group != group or row.help != help:
            raise ValueError(
                f"command {name!r} (group {group!r}, help {help!r}) does not match its row in "
                f"cli.commands.COMMANDS ({row}); change both together"
            )
        if name in self.registered:
            raise ValueError(f"command {name!r} registered twice")
        self.registered.append(name)
        return self._sub.add_parser(name, description=help, formatter_class=argparse.RawDescriptionHelpFormatter)

    def finish(self) -> argparse.ArgumentParser:
        """Put the whole command table, grouped by the data flow, into the top-level help."""
        lines = ["commands, in the order data flows through them:"]
        width = max(len(c.name) for c in COMMANDS)
        for key, title in GROUPS:
            lines.append(f"\n  {title}")
            lines.extend(f"    {c.name:<{width}}  {c.help}" for c in COMMANDS if c.group == key)
        lines.append("\nRun 'agentload COMMAND --help' for a command's options.")
        self.parser.epilog = "\n".join(lines)
        return self.parser
