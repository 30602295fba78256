"""The `agentload` command: the table of commands (harness/commands.py), each module imported only
when its command runs.

`agentload --help` prints the table without importing any command's module; `agentload CMD ...`
imports the one module that registers CMD, builds its parser and runs it. A user error
(`harness.errors.AgentloadError`) is printed as one paragraph with exit status 2; any other exception
is a bug: one line with exit status 1, or its traceback under `agentload --debug`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Sequence

from cli.commands import BY_NAME, CLI, COMMANDS
from harness.errors import AgentloadError


def build(modules: Sequence[str] | None = None) -> CLI:
    """The parser with the commands of `modules` (default: every module in the table) registered."""
    cli = CLI()
    wanted = list(dict.fromkeys(modules if modules is not None else (c.module for c in COMMANDS)))
    for module in wanted:
        register: Callable[[CLI], None] = importlib.import_module(module).register
        register(cli)
    cli.finish()
    return cli


def _command_name(argv: Sequence[str]) -> str | None:
    """The first word of argv that is not an option: the command asked for, if any."""
    for a in argv:
        if not a.startswith("-"):
            return a
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    name = _command_name(args_in)
    if name is not None and name not in BY_NAME:
        print(
            f"agentload: error: unknown command {name!r}; expected one of {', '.join(c.name for c in COMMANDS)} "
            "(agentload --help lists them)",
            file=sys.stderr,
        )
        return 2
    cli = build([BY_NAME[name].module] if name else [])
    args = cli.parser.parse_args(args_in)
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
