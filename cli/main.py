"""The `agentload` command: the table of commands (harness/commands.py), each module imported only
when its command runs.

`agentload --help` prints the table without importing any command's module; `agentload CMD ...`
imports the one module that registers CMD, builds its parser and runs it. A user error
(`harness.errors.AgentloadError`) is printed as one paragraph with exit status 2; any other exception
is a bug: one line with exit status 1, or its traceback under `agentload --debug`.

The command the process runs (`agentload ...`, `python -m cli.main ...`; `main()` with no argv)
keeps the cyclic garbage collector off its long-lived objects: the collector is paused while the
command's modules are imported and what they made is then frozen (`gc.freeze`), and all that is
left is frozen once the command is done, before the interpreter's shutdown collection. An import
makes hundreds of thousands of objects that live as long as the process; collecting over them
again and again, and once more at exit, cost a read-only command such as `analyze` about 0.15 s of
its ~2 s (issue 24). Objects made while the command runs are collected as before while it runs
(what is cyclic garbage at exit is left to the process's end, as Python allows). A caller that runs
`main(argv)` in-process (the tests) keeps its collector as it is.

A command whose row asks for a figure process (`Command.figure`: `analyze`, `test`) has it forked here,
before its module is imported (analysis/figure_process.py, imported here by name like the command
modules, so that `agentload --help` imports nothing of the packages), and finds it as `args.figures`.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cli.commands import ACTIONS, BY_NAME, CLI, COMMANDS, FIGURE_PROCESS, modules_for
from harness.errors import AgentloadError

if TYPE_CHECKING:
    from analysis.figure_process import FigureProcess


def build(modules: Sequence[str] | None = None) -> CLI:
    """The parser with the commands of `modules` (default: every module in the table) registered."""
    cli = CLI()
    every = [*(c.module for c in COMMANDS), *(a.module for a in ACTIONS)]  # an action's after its command's
    wanted = list(dict.fromkeys(modules if modules is not None else every))
    for module in wanted:
        register: Callable[[CLI], None] = importlib.import_module(module).register
        register(cli)
    cli.finish()
    return cli


def _build_frozen(modules: Sequence[str]) -> CLI:
    """`build(modules)` with the collector paused, and what the imports made frozen after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return build(modules)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _command_name(argv: Sequence[str]) -> str | None:
    """The first word of argv that is not an option: the command asked for, if any."""
    for a in argv:
        if not a.startswith("-"):
            return a
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run `agentload ARGV` (default: the process's own command line; see the module's docstring)."""
    if argv is not None:
        return _run(list(argv), build)
    try:
        return _run(sys.argv[1:], _build_frozen)
    finally:
        gc.freeze()  # the process ends next: its shutdown collection need not go over all of it


def _run(args_in: list[str], builder: Callable[[Sequence[str]], CLI]) -> int:
    name = _command_name(args_in)
    if name is not None and name not in BY_NAME:
        print(
            f"agentload: error: unknown command {name!r}; expected one of {', '.join(c.name for c in COMMANDS)} "
            "(agentload --help lists them)",
            file=sys.stderr,
        )
        return 2
    row = BY_NAME.get(name) if name is not None else None
    figures = None
    if row is not None and row.figure and not {"-h", "--help"} & set(args_in):
        figures = importlib.import_module(FIGURE_PROCESS).FigureProcess.start()
    if figures is None:
        return _build_and_call(args_in, builder, None)
    with figures:  # told to end and reaped however the command ends
        return _build_and_call(args_in, builder, figures)


def _build_and_call(args_in: list[str], builder: Callable[[Sequence[str]], CLI], figures: FigureProcess | None) -> int:
    cli = builder(modules_for(args_in))
    args = cli.parser.parse_args(args_in)
    if figures is not None:
        args.figures = figures
    func = getattr(args, "func", None)
    if func is None:
        # a command group given without its action, or nothing at all
        sub_parser = getattr(args, "_parser", None)
        (sub_parser or cli.parser).print_help(sys.stderr)
        return 2
    try:
        return int(func(args) or 0)
    except AgentloadError as exc:
        print(f"agentload: error: {str(exc).strip() or type(exc).__name__}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug_top or getattr(args, "debug", False):
            raise
        print(
            f"agentload: internal error (a bug in agentload): {type(exc).__name__}: {exc}; "
            "run again with --debug for the traceback",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
