"""The one root of the errors agentload raises for its users, and their kinds.

Why one root: the command line must tell a person's mistake (a malformed file, a refused submission,
a tag that does not exist) from a bug. Everything under `AgentloadError` is the former: its message
names the file, field or value at fault and what was expected, and `agentload` prints it as one
paragraph with exit status 2. Anything else that escapes a command is a bug in agentload and keeps its
traceback (`agentload --debug`).

Each kind below is the family a module's own error joins (`RegistrationError(ConfigError)`,
`PlanError`, `SubmitRefused(SchedulerError)`), so a caller can catch a family without knowing every
module, and a module never imports another module just to subclass its error.
"""

from __future__ import annotations


class AgentloadError(Exception):
    """An error meant for the person running agentload: the message says what to change."""


class ConfigError(AgentloadError, ValueError):
    """A configuration file, or a record read like one, is malformed (file, field path, value, expected)."""


class PlanError(AgentloadError, ValueError):
    """A frozen plan cannot be made or read as asked."""


class RuleError(AgentloadError, ValueError):
    """A rule spec is malformed or cannot judge what it was given."""


class RecordError(AgentloadError, ValueError):
    """A run record or a test's record (manifest, accounting export, freeze) cannot be read as its format says."""


class EngineError(AgentloadError, RuntimeError):
    """A serving engine cannot be launched, reached or used as the cell says (the message says where its log is)."""


class SchedulerError(AgentloadError, RuntimeError):
    """The scheduler (SLURM) refused or could not answer."""


class GitError(AgentloadError, RuntimeError):
    """git refused or could not answer (not a repository, no such tag, a remote that cannot be reached)."""


class UsageError(AgentloadError):
    """Bad command-line input that argparse cannot see (a missing file, contradictory options)."""
