"""The package DAG of docs/architecture.md holds on the source: every module placed in a unit, no
import the table does not allow, no import cycle between modules, nothing but the deferred heavy
packages imported inside a function. The checker is shown to fail on planted violations."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.layering import all_problems, cycles, read_source, read_table
from support.paths import REPO

ROOT = REPO
DOC = ROOT / "docs" / "architecture.md"


def test_the_source_keeps_the_table() -> None:
    problems = all_problems(ROOT, DOC)
    assert not problems, "\n".join(problems)


def test_the_table_is_read_whole() -> None:
    t = read_table(DOC)
    assert {"harness.config", "analysis", "runs", "prereg", "slurm", "review", "cli"} <= set(t.units)
    assert t.units["analysis"].layer < t.units["runs"].layer < t.units["review"].layer < t.units["cli"].layer
    assert {"numpy", "pandas", "pyarrow", "matplotlib", "submitit", "aiohttp"} <= t.deferred


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    """A copy of the source tree (and the doc) to plant violations in."""
    for pkg in ("harness", "analysis", "provenance", "runs", "sim2real", "prereg", "slurm", "review", "cli"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "docs").mkdir()
    shutil.copy(DOC, tmp_path / "docs" / "architecture.md")
    return tmp_path


def test_a_planted_upward_import_fails(tree: Path) -> None:
    (tree / "analysis" / "planted.py").write_text("from slurm.scheduler import job_states\n")
    problems = all_problems(tree, tree / "docs" / "architecture.md")
    assert any("analysis.planted imports slurm.scheduler" in p and "may not import" in p for p in problems), problems


def test_a_planted_cycle_fails(tree: Path) -> None:
    (tree / "harness" / "workload" / "cyc_a.py").write_text("from harness.workload import cyc_b\n")
    (tree / "harness" / "workload" / "cyc_b.py").write_text("from harness.workload.cyc_a import x\n")
    assert ["harness.workload.cyc_a", "harness.workload.cyc_b"] in cycles(read_source(tree))
    assert any("import cycle" in p for p in all_problems(tree, tree / "docs" / "architecture.md"))


def test_a_planted_cycle_dodging_function_import_fails(tree: Path) -> None:
    (tree / "runs" / "dodge.py").write_text("def f():\n    from runs.arms import execute_run\n    return execute_run\n")
    problems = all_problems(tree, tree / "docs" / "architecture.md")
    assert any("runs/dodge.py:2: imports runs.arms inside a function" in p for p in problems), problems


def test_a_deferred_heavy_import_is_allowed(tree: Path) -> None:
    (tree / "analysis" / "lazy.py").write_text("def f():\n    import matplotlib\n    return matplotlib\n")
    assert not all_problems(tree, tree / "docs" / "architecture.md")


def test_a_module_in_no_unit_fails(tree: Path) -> None:
    doc = tree / "docs" / "architecture.md"
    doc.write_text(doc.read_text().replace("| 3 I/O | `provenance` |", "| 3 I/O | `provenance.git` |"))
    problems = all_problems(tree, doc)
    assert any("provenance.meta: in no unit" in p for p in problems), problems


def test_a_table_pointing_upward_fails(tree: Path) -> None:
    doc = tree / "docs" / "architecture.md"
    doc.write_text(
        doc.read_text()
        .replace("| `harness.config` | `harness.errors` |", "| `harness.config` | `harness.errors`, `runs` |", 1)
        .replace("strict YAML in and out | `harness.errors` |", "strict YAML in and out | `harness.errors`, `runs` |")
    )
    problems = all_problems(tree, doc)
    assert any("unit harness.config (layer 1) may import runs (layer 4): upward" in p for p in problems), problems


def test_every_package_of_the_table_is_installed() -> None:
    """The wheel (and an editable install's finder) holds every top-level package the table places:
    a package left out of pyproject's list imports from the checkout in tests and fails as `agentload`."""
    import tomllib
    from fnmatch import fnmatch

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    tops = {u.split(".")[0] for u in read_table(DOC).units}
    missing = sorted(t for t in tops if not any(fnmatch(t, pat) for pat in include))
    assert not missing, f"pyproject.toml [tool.setuptools.packages.find] include lacks {missing}"


def test_test_modules_have_unique_basenames() -> None:
    """pytest imports test modules by basename (rootdir-relative, no packages under tests/), so two
    files of one name in different folders stop the whole collection with 'import file mismatch'."""
    seen: dict[str, list[str]] = {}
    for p in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def script_folders_shadowing_the_stdlib(root: Path) -> list[str]:
    """A file run by path (`python harness/servers/tiny_model.py`) puts its folder first on sys.path,
    so a module of that folder named like a standard-library one (an `http.py`) replaces it for
    everything the script imports: torch then failed on `import http.client`."""
    import os
    import sys

    found = []
    for folder, dirs, files in os.walk(root):
        # the project's own folders only: not the venvs, caches and .git (hidden), nor the tests
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not (folder == str(root) and d == "tests"))
        here = Path(folder)
        for script in sorted(f for f in files if f.endswith(".py")):
            if 'if __name__ == "__main__"' not in (here / script).read_text():
                continue
            for sibling in sorted(here.iterdir()):
                name = sibling.stem if sibling.suffix == ".py" else sibling.name if sibling.is_dir() else ""
                if name in sys.stdlib_module_names:
                    rel = (here / script).relative_to(root)
                    found.append(f"{rel}: its folder holds {sibling.name}, a standard-library name")
    return found


def test_no_folder_of_a_script_shadows_the_standard_library() -> None:
    problems = script_folders_shadowing_the_stdlib(ROOT)
    assert not problems, "\n".join(problems)


def test_a_planted_stdlib_name_beside_a_script_fails(tmp_path: Path) -> None:
    (tmp_path / "tool.py").write_text('if __name__ == "__main__":\n    pass\n')
    (tmp_path / "http.py").write_text("")
    assert script_folders_shadowing_the_stdlib(tmp_path) == [
        "tool.py: its folder holds http.py, a standard-library name"
    ]
