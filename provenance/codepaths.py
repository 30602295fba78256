"""Which repository paths are code: a change there can change a run or a verdict (Decision 19).

One definition for the three places that ask: the job script (it refuses to run a registration
when code changed since the registration's commit), the registered analysis (which runs are bound,
and whether the checkout's own code may judge them) and whole-test verification. Data that lives
under a code folder and changes no run or verdict is not code: registrations, their inputs and
templates are added as tests are registered (the paper's native E2 runs counted after the checkout
moved to a commit that added grid-cell registrations and no code); freeze records are written by
`predict freeze` before a test's runs.
"""

from __future__ import annotations

CODE_DIRS = ("harness/", "analysis/", "prereg/", "slurm/", "runs/", "review/", "provenance/", "cli/")
DATA_DIRS = ("prereg/registrations/", "prereg/inputs/", "prereg/templates/", "prereg/freezes/")


def is_code_path(path: str) -> bool:
    """A repository path whose change can change a run or a verdict."""
    return path.startswith(CODE_DIRS) and not path.startswith(DATA_DIRS)
