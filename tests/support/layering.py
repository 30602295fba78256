"""The layer table of docs/architecture.md, and the checks the source must pass against it.

Why here and not in the package: the rule binds the code, so it is checked on the code from the
outside (parsed with ast, never imported), and the same checker runs on a planted tree to show it
can fail.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

START, END = "<!-- layers:start -->", "<!-- layers:end -->"
TOP_PACKAGES = ("harness", "analysis", "provenance", "runs", "sim2real", "prereg", "slurm", "review", "cli")


@dataclass(frozen=True)
class Unit:
    layer: int
    name: str
    may_import: frozenset[str]


@dataclass
class Table:
    units: dict[str, Unit]
    deferred: frozenset[str]

    def unit_of(self, module: str) -> str | None:
        """The longest unit name that is the module or a package above it."""
        best = None
        for u in self.units:
            if (module == u or module.startswith(u + ".")) and (best is None or len(u) > len(best)):
                best = u
        return best


def read_table(doc: Path) -> Table:
    """Parse the table between the markers: `| layer | unit | job | may import |`, then the deferred line."""
    text = doc.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise ValueError(f"{doc}: no layer table between {START} and {END}")
    block = text[text.index(START) + len(START) : text.index(END)]
    units: dict[str, Unit] = {}
    deferred: set[str] = set()
    for line in block.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and cells[0][:1].isdigit():
            name = cells[1].strip("`")
            allowed = frozenset(re.findall(r"`([\w.]+)`", cells[3]))
            if name in units:
                raise ValueError(f"{doc}: unit {name} listed twice")
            units[name] = Unit(int(cells[0].split()[0]), name, allowed)
        elif line.startswith("Deferred"):
            deferred |= set(re.findall(r"`([\w.]+)`", line))
    if not units or not deferred:
        raise ValueError(f"{doc}: the layer table or its deferred line is empty")
    return Table(units, frozenset(deferred))


@dataclass
class Source:
    """Every module of the tree and its imports of project modules and of anything inside a function."""

    modules: dict[str, Path] = field(default_factory=dict)
    edges: dict[str, set[tuple[str, int]]] = field(default_factory=lambda: defaultdict(set))  # module -> (target, line)
    in_function: list[tuple[str, int, str]] = field(default_factory=list)  # (module, line, imported module)


def _module_name(root: Path, f: Path) -> str:
    parts = list(f.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def read_source(root: Path, packages: tuple[str, ...] = TOP_PACKAGES) -> Source:
    src = Source()
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            src.modules[_module_name(root, f)] = f

    def resolve(name: str) -> str | None:
        while name:
            if name in src.modules:
                return name
            name = name.rpartition(".")[0]
        return None

    for mod, f in src.modules.items():
        tree = ast.parse(f.read_text(encoding="utf-8"), filename=str(f))
        is_pkg = f.name == "__init__.py"

        def visit(node: ast.AST, in_func: bool, mod: str = mod, is_pkg: bool = is_pkg) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if isinstance(child, ast.Import):
                        targets = [a.name for a in child.names]
                    else:
                        if child.level:
                            base = mod.split(".")
                            base = base[: len(base) - child.level + (1 if is_pkg else 0)]
                            name = ".".join(base + ([child.module] if child.module else []))
                        else:
                            name = child.module or ""
                        targets = [name] + [f"{name}.{a.name}" for a in child.names]
                    if in_func:
                        src.in_function.append((mod, child.lineno, targets[0]))
                    for t in targets:
                        r = resolve(t)
                        if r is not None and r != mod:
                            src.edges[mod].add((r, child.lineno))
                else:
                    visit(child, in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
    return src


def unplaced(table: Table, src: Source) -> list[str]:
    return sorted(m for m in src.modules if table.unit_of(m) is None)


def forbidden_imports(table: Table, src: Source) -> list[str]:
    """Imports from one unit into another that its row does not list."""
    out = []
    for mod, targets in sorted(src.edges.items()):
        u = table.unit_of(mod)
        for t, line in sorted(targets):
            v = table.unit_of(t)
            if u is None or v is None or u == v:
                continue
            if v not in table.units[u].may_import:
                out.append(f"{src.modules[mod]}:{line}: {mod} imports {t} (unit {v}), which unit {u} may not import")
    return out


def cycles(src: Source) -> list[list[str]]:
    """Strongly connected components of more than one module (import cycles), any import counted."""
    graph = {m: sorted({t for t, _ in src.edges.get(m, ())}) for m in src.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # Tarjan, iterative enough for this tree's depth
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return found


def function_imports(table: Table, src: Source) -> list[str]:
    """Imports inside a function of anything but a deferred package."""
    return [
        f"{src.modules[m]}:{line}: imports {name} inside a function; only {sorted(table.deferred)} may be deferred"
        for m, line, name in src.in_function
        if name.split(".")[0] not in table.deferred
    ]


def table_problems(table: Table) -> list[str]:
    """The table names only its own units, never a higher layer, and is itself acyclic."""
    out = []
    for u in table.units.values():
        for v in sorted(u.may_import):
            if v not in table.units:
                out.append(f"unit {u.name} may import {v}, which is no unit of the table")
            elif table.units[v].layer > u.layer:
                out.append(f"unit {u.name} (layer {u.layer}) may import {v} (layer {table.units[v].layer}): upward")
    return out


def all_problems(root: Path, doc: Path, packages: tuple[str, ...] = TOP_PACKAGES) -> list[str]:
    table = read_table(doc)
    src = read_source(root, packages)
    return [
        *table_problems(table),
        *(f"{m}: in no unit of the table" for m in unplaced(table, src)),
        *forbidden_imports(table, src),
        *(f"import cycle: {' -> '.join(c)}" for c in cycles(src)),
        *function_imports(table, src),
    ]
