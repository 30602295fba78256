"""Compare two verdict folders (verdict.json and report.md), e.g. the README's main job before and
after a change to the judge, and print every difference but the wall times.

Why: a change that moves judging code (one judging path for every family) must leave the verdict
of the same runs as it was. The comparison is JSON-aware: wall-time keys (`wall_s`) are left out,
each folder's own path is replaced by `<out>` (the run directories the verdict names live in it),
and the embedded `rule_spec` is reported apart, key by key, since it is the rule as data and may
change form without changing a verdict. In report.md the `wall s` column of every table that has
one is blanked.

Usage: python benchmarks/compare_verdicts.py BEFORE_DIR AFTER_DIR   (exit 1 if anything else differs)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

WALL_KEYS = ("wall_s",)


def _normalise(obj: Any, root: str) -> Any:
    if isinstance(obj, dict):
        return {k: _normalise(v, root) for k, v in obj.items() if k not in WALL_KEYS}
    if isinstance(obj, list):
        return [_normalise(v, root) for v in obj]
    if isinstance(obj, str) and root in obj:
        return obj.replace(root, "<out>")
    return obj


def json_diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Every path where `a` and `b` differ (dict keys in any order; lists by position)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a:
                out.append(f"{p}: only after")
            elif k not in b:
                out.append(f"{p}: only before")
            else:
                out += json_diff(a[k], b[k], p)
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items before, {len(b)} after"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in json_diff(x, y, f"{path}[{i}]")]
    if a != b or type(a) is not type(b):
        return [f"{path}: {a!r} before, {b!r} after"]
    return []


def _count_wall(obj: Any) -> int:
    if isinstance(obj, dict):
        return sum(1 for k in obj if k in WALL_KEYS) + sum(_count_wall(v) for v in obj.values())
    if isinstance(obj, list):
        return sum(_count_wall(v) for v in obj)
    return 0


def mask_wall_columns(md: str) -> str:
    """Blank the `wall s` column of every Markdown table whose header names one."""
    out, col = [], None
    for line in md.splitlines():
        cells = line.split("|")
        if line.startswith("|"):
            names = [c.strip() for c in cells]
            if "wall s" in names:
                col = names.index("wall s")
            elif col is not None and len(cells) > col and not re.fullmatch(r"\s*-+\s*", cells[col]):
                cells[col] = " ~ "
                line = "|".join(cells)
        else:
            col = None
        out.append(line)
    return "\n".join(out)


def compare(before: Path, after: Path) -> tuple[list[str], list[str], list[str], int]:
    """(verdict differences, rule_spec differences, report.md differing lines, wall-time keys left out)."""
    vb = json.loads((before / "verdict.json").read_text())
    va = json.loads((after / "verdict.json").read_text())
    walls = _count_wall(vb)
    sb, sa = vb.pop("rule_spec", None), va.pop("rule_spec", None)
    diffs = json_diff(_normalise(vb, str(before.resolve())), _normalise(va, str(after.resolve())))
    spec_diffs = json_diff(sb, sa, "rule_spec")
    mb = mask_wall_columns((before / "report.md").read_text()).splitlines()
    ma = mask_wall_columns((after / "report.md").read_text()).splitlines()
    md = [f"line {i + 1}: {x!r} before, {y!r} after" for i, (x, y) in enumerate(zip(mb, ma)) if x != y]
    if len(mb) != len(ma):
        md.append(f"{len(mb)} lines before, {len(ma)} after")
    return diffs, spec_diffs, md, walls


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    diffs, spec_diffs, md, walls = compare(args.before, args.after)
    print(f"verdict.json: {len(diffs)} difference(s) outside rule_spec ({walls} wall-time values left out)")
    for d in diffs:
        print(f"  {d}")
    top = sorted({d.split(":")[0].split("[")[0].split(".")[1] for d in spec_diffs if "." in d.split(":")[0]})
    print(f"rule_spec: {len(spec_diffs)} difference(s), under {top}")
    for d in spec_diffs:
        print(f"  {d}")
    print(f"report.md: {len(md)} differing line(s) (the wall s column blanked)")
    for d in md:
        print(f"  {d}")
    return 1 if diffs or md else 0


if __name__ == "__main__":
    sys.exit(main())
