"""Refill every committed registration from the template and inputs it records, and say which
files changed.

Why: a registration is the SHA-256 of its bytes, and the tests pin that each committed file is
exactly its fill. When the registration format gains a field (a cell field, a test field), every
committed file must be refilled once, in dependency order (a derived registration binds its
parent's hash). The template and the inputs folder are read from the file itself (`fill.template`,
`inputs`), so nothing is asserted by hand.

Usage: python scripts/refill_registrations.py [--check]   (--check: exit 1 if any file would change)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prereg.fill import fill_registration  # noqa: E402
from prereg.registration import dump_registration, load_registration  # noqa: E402


def _order(paths: list[Path]) -> list[Path]:
    """Parents before the registrations that derive from them or are based on them."""
    regs = {p: load_registration(p) for p in paths}
    by_name = {r.name: p for p, r in regs.items()}
    done: list[Path] = []

    def visit(p: Path) -> None:
        if p in done:
            return
        f = regs[p].fill
        parent = f.get("derived_from") or (f.get("based_on") or {}).get("name")
        if parent in by_name:
            visit(by_name[parent])
        done.append(p)

    for p in sorted(paths):
        visit(p)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a refill differs")
    args = ap.parse_args(argv)
    changed = []
    for path in _order(sorted((ROOT / "prereg/registrations").glob("*.yaml"))):
        reg = load_registration(path)
        template = ROOT / reg.fill["template"]["path"]
        inputs = {str(Path(i.path).parent) for i in reg.inputs if i.role != "parent" and not reg.fill.get("based_on")}
        if len(inputs) > 1:
            print(f"{path.name}: inputs in several folders {sorted(inputs)}; refill it by hand", file=sys.stderr)
            return 2
        inputs_dir = ROOT / inputs.pop() if inputs else None
        data = dump_registration(fill_registration(inputs_dir, template, repo_root=ROOT, name=reg.name).registration)
        if data != path.read_bytes():
            changed.append(path.name)
            if not args.check:
                path.write_bytes(data)
        print(f"{'changed' if path.name in changed else 'same   '} {path.relative_to(ROOT)}")
    if args.check and changed:
        print(
            f"{len(changed)} registration(s) differ from their fill: run scripts/refill_registrations.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
