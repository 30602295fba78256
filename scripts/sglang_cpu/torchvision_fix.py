"""Make the PyPI torchvision importable next to a CPU torch, reversibly (engine venv only).

Run with the ENGINE's python:  python torchvision_fix.py apply|revert|status

Why: SGLang imports torchvision.transforms at startup. The torchvision wheel on PyPI is a CUDA build:
its C++ ops library fails to load with a CPU torch, and then torchvision/_meta_registrations.py
still registers fake kernels for "torchvision::nms" and "torchvision::qnms", which raises
`RuntimeError: operator torchvision::nms does not exist` and kills the import. The fix makes those
two registrations conditional on torchvision.extension._has_ops(), the same guard the file already
uses elsewhere. Without the C++ ops torchvision's image ops are unavailable; a text model needs none.

`apply` keeps the original beside it (_meta_registrations.py.agentload-orig) and marks the patched
lines; applying twice changes nothing; `revert` restores the original byte for byte.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

MARK = "# agentload-cpu-fix"
OPS = ("torchvision::nms", "torchvision::qnms")
BACKUP_SUFFIX = ".agentload-orig"


def target() -> Path:
    spec = importlib.util.find_spec("torchvision")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torchvision is not installed in this environment")
    return Path(next(iter(spec.submodule_search_locations))) / "_meta_registrations.py"


def patched_text(text: str) -> tuple[str, int]:
    out: list[str] = []
    changed = 0
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        for op in OPS:
            if stripped == f'@torch.library.register_fake("{op}")':
                indent = line[: len(line) - len(line.lstrip())]
                newline = "\n" if line.endswith("\n") else ""
                line = (
                    f'{indent}@(torch.library.register_fake("{op}") if torchvision.extension._has_ops() '
                    f"else (lambda fn: fn))  {MARK}{newline}"
                )
                changed += 1
                break
        out.append(line)
    return "".join(out), changed


def status(path: Path) -> str:
    text = path.read_text()
    if MARK in text:
        return "patched"
    _, n = patched_text(text)
    return "needs-patch" if n else "not-needed"


def apply(path: Path) -> str:
    text = path.read_text()
    if MARK in text:
        return "already patched"
    new, n = patched_text(text)
    if n == 0:
        return "nothing to patch (this torchvision does not register those fakes unguarded)"
    if n != len(OPS):
        raise SystemExit(f"{path}: expected {len(OPS)} registrations to guard, found {n}; not patching")
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if not backup.exists():
        shutil.copy2(path, backup)
    path.write_text(new)
    return f"patched {n} lines (original kept in {backup.name})"


def revert(path: Path) -> str:
    backup = path.with_name(path.name + BACKUP_SUFFIX)
    if not backup.exists():
        return "no backup: nothing to revert" if MARK not in path.read_text() else "patched but no backup!"
    shutil.copy2(backup, path)
    backup.unlink()
    return "reverted"


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("apply", "revert", "status"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path = target()
    action = {"apply": apply, "revert": revert, "status": status}[argv[0]]
    print(f"{path}: {action(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
