"""Where an engine's own source defines its Prometheus series and reads its environment variables.

Stdlib only: imported by the launch-check drivers beside it, which run INSIDE an engine's venv
(harness/servers/launchcheck.py spawns them). The scan reads the installed package's files with
`ast`, so it sees every code path of that version, the CUDA one included, not just what a CPU
server happened to export: a series is found where a metric constructor (Gauge, Counter, Histogram,
Summary, or an engine's own `_gauge_cls`-style wrapper) is called with `name=` that string, directly
or through a variable assigned it in the same function. Each definition carries the `if`/ternary
conditions around it that name a device or platform (cuda, cpu, device, platform, hip, rocm, xpu,
npu, hpu, mps, tpu): a series defined only under such a condition may exist on one kind of host and
not on another, which is what the check must tell.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEVICE_WORDS = re.compile(
    r"(?<![a-z])(cuda|cpu|device|device_type|platform|hip|rocm|xpu|npu|hpu|mps|tpu)(?![a-z])", re.IGNORECASE
)
KINDS = ("histogram", "counter", "gauge", "summary", "info", "enum")


def package_dir(name: str) -> Path:
    """The installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {name!r} is not installed in this interpreter")
    return Path(next(iter(spec.submodule_search_locations)))


def exposed(name: str, kind: str) -> list[str]:
    """The sample names a metric of `kind` defined as `name` shows on /metrics (prometheus_client
    drops a counter's `_total` and adds it back, and adds `_created`)."""
    if kind == "counter":
        base = name[: -len("_total")] if name.endswith("_total") else name
        return [base + "_total", base + "_created"]
    if kind == "histogram":
        return [name + "_bucket", name + "_sum", name + "_count", name + "_created"]
    if kind == "summary":
        return [name + "_sum", name + "_count", name + "_created"]
    if kind == "info":
        return [name + "_info"]
    return [name]


def _kind(call: ast.Call) -> str:
    text = ast.unparse(call.func).lower()
    return next((k for k in KINDS if k in text), "unknown")


def _name_kw(call: ast.Call) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == "name":
            return kw.value
    return None


class _Scanner(ast.NodeVisitor):
    """Collects metric definitions with the device conditions they sit under."""

    def __init__(self, prefix: str, path: str) -> None:
        self.prefix = prefix
        self.path = path
        self.guards: list[str] = []
        self.assigned: list[dict[str, str]] = [{}]  # per function: variable -> metric name
        self.found: list[dict[str, Any]] = []

    def _guarded(self, test: ast.expr, body: list[ast.stmt], orelse: list[ast.stmt]) -> None:
        text = ast.unparse(test)
        words = DEVICE_WORDS.findall(text)
        self.visit(test)
        for branch, label in ((body, text), (orelse, f"not ({text})")):
            if words:
                self.guards.append(label)
            for node in branch:
                self.visit(node)
            if words:
                self.guards.pop()

    def visit_If(self, node: ast.If) -> None:
        self._guarded(node.test, node.body, node.orelse)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        self._guarded(node.test, [ast.Expr(node.body)], [ast.Expr(node.orelse)])

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.assigned.append({})
        self.generic_visit(node)
        self.assigned.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Assign(self, node: ast.Assign) -> None:
        v = node.value
        if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith(self.prefix):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.assigned[-1][t.id] = v.value
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        arg = _name_kw(node)
        name = None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            name = arg.value
        elif isinstance(arg, ast.Name):
            name = self.assigned[-1].get(arg.id)
        if name is not None and name.startswith(self.prefix):
            kind = _kind(node)
            if kind != "unknown":
                self.found.append({"name": name, "kind": kind, "exposes": exposed(name, kind), "file": self.path,
                                   "line": node.lineno, "device_guards": list(self.guards)})  # fmt: skip
        self.generic_visit(node)


def _files(root: Path, needle: str) -> Iterator[tuple[Path, str]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "tests", "test")]
        for f in filenames:
            if f.endswith(".py"):
                p = Path(dirpath) / f
                try:
                    text = p.read_text(encoding="utf-8", errors="replace")
                except OSError:
                    continue
                if needle in text:
                    yield p, text


def metric_definitions(package: str, prefix: str) -> list[dict[str, Any]]:
    """Every metric the installed `package` defines whose name starts with `prefix`."""
    root = package_dir(package)
    out: list[dict[str, Any]] = []
    for path, text in _files(root, prefix):
        try:
            tree = ast.parse(text, filename=str(path))
        except SyntaxError:
            continue
        sc = _Scanner(prefix, str(path.relative_to(root.parent)))
        sc.visit(tree)
        out += sc.found
    return out


def find_series(package: str, prefix: str, names: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Each series name -> the definitions that expose it (empty: the source defines none)."""
    defs = metric_definitions(package, prefix)
    return {n: [d for d in defs if n in d["exposes"]] for n in names}


def env_reads(package: str, names: list[str]) -> dict[str, list[str]]:
    """Each environment variable -> the files of the package that name it (empty: none does)."""
    root = package_dir(package)
    out: dict[str, list[str]] = {n: [] for n in names}
    for n in names:
        for path, _ in _files(root, n):
            out[n].append(str(path.relative_to(root.parent)))
    return out
