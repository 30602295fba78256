"""The layering the architecture promises, checked on the source: the judging half (analysis/) never
imports what runs things, the reference engine model never imports a client, and the clients never
import the engine model. Parsed with ast, so a moved import or an import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# (package whose modules are checked, forbidden import prefixes, why)
RULES = [
    ("analysis", ("harness.drivers", "harness.protocols", "harness.servers", "harness.emulator", "harness.refengine.model"),
     "analysis reads run records and plans only"),
    ("harness/refengine", ("harness.client", "harness.drivers", "harness.protocols", "harness.servers"),
     "the engine model is a pure state machine, unaware of clients and clocks"),
    ("harness/client", ("harness.refengine", "harness.drivers", "harness.servers", "harness.emulator"),
     "the session client is sans-IO and engine-agnostic"),
]  # fmt: skip


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


@pytest.mark.parametrize("package,forbidden,why", RULES, ids=[r[0] for r in RULES])
def test_no_forbidden_imports(package: str, forbidden: tuple[str, ...], why: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules under {package}"
    bad = [
        f"{p.relative_to(ROOT)}:{line}: {mod}"
        for p in files
        for line, mod in _imports(p)
        if any(mod == f or mod.startswith(f + ".") for f in forbidden)
    ]
    assert not bad, f"{why}:\n" + "\n".join(bad)


def test_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The checker itself must be able to fail: an import inside a function is found."""
    p = tmp_path / "m.py"
    p.write_text("def f():\n    from harness.protocols.arms import run_test\n")
    assert _imports(p) == [(2, "harness.protocols.arms")]


def test_commands_of_running_are_not_registered_from_analysis() -> None:
    from harness import cli

    analysis_registrars = [r for r in cli.REGISTRARS if r.startswith("analysis.")]
    built = cli.build(analysis_registrars)
    names = {c.name for c in built._commands}
    assert names and not names & {"run", "test", "calibrate", "smoke", "emulator"}, names
