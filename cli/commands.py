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
(tests/unit/cli/test_cli_plan.py registers every module against it).

An action of a command that imports much more than the command's other actions (`prereg design`
the simulator, `jobs collect` the registered analysis, beside `prereg check` and `jobs status`,
which a user repeats between runs) has a module of its own, listed in `ACTIONS`: the command's
module adds its parser with `cli.deferred_action(sub, command, action)` (with the row's help, in the
place it wants it listed), and `agentload CMD ACTION ...` imports the action's module too, whose
`register(cli)` takes that parser with `cli.action_parser(command, action)` and fills it. Modules
import modules only at their top (docs/architecture.md): the table, not an import inside a function,
is what defers them.

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


#: the module whose `FigureProcess.start()` `agentload` calls for a row with `figure` (by name, as
#: it imports the command modules: `agentload --help` imports no package of the project)
FIGURE_PROCESS = "analysis.figure_process"


@dataclass(frozen=True)
class Command:
    """One top-level command: its name, data-flow group, one-line help and the module that registers it.

    `figure`: the command draws reports' figures, so `agentload` forks its figure process
    (analysis/figure_process.py) before importing the module: the child's import of matplotlib then
    runs beside the module's own imports (the scoring: pandas, the measures), and the figures are
    drawn by a process that has it already."""

    name: str
    group: str
    help: str
    module: str
    figure: bool = False


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
        "cli.jobs",
    ),
    Command("emulator", "execute", "serve the engine model over SGLang's or vLLM's HTTP API", "cli.emulator"),
    Command(
        "smoke",
        "execute",
        "Stage 0: check an engine server against a cell (flags, cache reporting, pool, flush)",
        "cli.smoke",
    ),
    Command("run", "execute", "drive one arm x rate x seed of a test into a run directory", "cli.run"),
    Command("test", "execute", "run a whole test (every arm x rate x seed) and score it", "cli.run", figure=True),
    Command(
        "replay", "judge", "replay real runs in the simulator (their plan, arm, cell) and report parity", "cli.sim2real"
    ),
    Command(
        "analyze",
        "judge",
        "score run directories with a registered rule; write verdict, report, figure",
        "cli.analyze",
        figure=True,
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


@dataclass(frozen=True)
class Action:
    """An action of a command registered by a module of its own (see the module's docstring)."""

    command: str
    name: str
    help: str
    module: str


ACTIONS: list[Action] = [
    Action(
        "prereg",
        "design",
        "before registering: is each arm's outcome reachable; the cheapest decisive protocol",
        "cli.design",
    ),
    Action(
        "predict",
        "make",
        "make a prediction file (simulator, model F on the frozen plans, entry model)",
        "cli.predict_make",
    ),
    Action(
        "predict",
        "score",
        "score frozen predictions (read from the tag) against runs or a test directory",
        "cli.predict_score",
    ),
    Action(
        "jobs",
        "collect",
        "accounting export, run directories, failures with reasons, then the registered analysis",
        "cli.jobs_collect",
    ),
    Action(
        "jobs",
        "resubmit",
        "submit again, unchanged, the jobs whose run never started (refused or failed before sending a turn)",
        "cli.jobs_resubmit",
    ),
]
ACTION_BY_NAME: dict[tuple[str, str], Action] = {(a.command, a.name): a for a in ACTIONS}


def modules_for(argv: list[str]) -> list[str]:
    """The modules `agentload ARGV` needs: its command's, and its action's where that has its own
    (the first two words of argv that are not options); none for a bare `agentload`."""
    words = [a for a in argv if not a.startswith("-")][:2]
    if not words or words[0] not in BY_NAME:
        return []
    out = [BY_NAME[words[0]].module]
    action = ACTION_BY_NAME.get((words[0], words[1])) if len(words) > 1 else None
    return out + ([action.module] if action is not None else [])


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
        self._actions: dict[tuple[str, str], argparse.ArgumentParser] = {}
        self.filled: list[tuple[str, str]] = []  # deferred actions whose module registered them

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

    def deferred_action(
        self, sub: argparse._SubParsersAction[argparse.ArgumentParser], command: str, name: str
    ) -> argparse.ArgumentParser:
        """Add the parser of an action listed in ACTIONS to its command's subparsers `sub`, with the
        row's help: `agentload CMD --help` lists it, and its module fills it when it is imported."""
        row = ACTION_BY_NAME.get((command, name))
        if row is None:
            raise ValueError(f"action {command} {name} has no row in cli.commands.ACTIONS")
        p = sub.add_parser(name, help=row.help, description=row.help)
        p.set_defaults(func=None, _parser=p)
        self._actions[(command, name)] = p
        return p

    def action_parser(self, command: str, name: str) -> argparse.ArgumentParser:
        """The parser of a deferred action, for its own module's register() to fill."""
        if (command, name) not in self._actions:
            raise ValueError(
                f"action {command} {name}: its command's module has not added it (cli.deferred_action), or the "
                "command's module was not registered first"
            )
        if (command, name) in self.filled:
            raise ValueError(f"action {command} {name} registered twice")
        self.filled.append((command, name))
        return self._actions[(command, name)]

    def finish(self) -> argparse.ArgumentParser:
        """Put the whole command table, grouped by the data flow, into the top-level help."""
        missing = [
            f"{a.command} {a.name}"
            for a in ACTIONS
            if a.command in self.registered and (a.command, a.name) not in self._actions
        ]
        if missing:
            raise ValueError(f"actions listed in cli.commands.ACTIONS that their command did not add: {missing}")
        lines = ["commands, in the order data flows through them:"]
        width = max(len(c.name) for c in COMMANDS)
        for key, title in GROUPS:
            lines.append(f"\n  {title}")
            lines.extend(f"    {c.name:<{width}}  {c.help}" for c in COMMANDS if c.group == key)
        lines.append("\nRun 'agentload COMMAND --help' for a command's options.")
        self.parser.epilog = "\n".join(lines)
        return self.parser
