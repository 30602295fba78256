"""What compiling the simulator's hot path gives: the same code built with mypyc, against itself.

A design measurement, not a build option. The engine model's profile is flat (no function above a
few percent of a turn's time): what is left is the interpreter's per-call and per-attribute cost,
which only a compiler removes. This copies the working tree into a temporary folder, compiles the
modules a simulated turn runs through (the engine model, the virtual-time driver, the closed and
session clients, the draws) with mypyc, and then

- plays bench_sim's good and trapped states in both trees, alternating (benchmarks/bench_sim.py
  --against), for each cell asked for;
- with --digest, plays records_digest's fixed run set in both trees and says whether every record
  table is byte-identical (a compiled build must not move a record).

    .venv/bin/python benchmarks/bench_compiled.py [--cell sglang-a100-300k --cell vllm-a100-300k]
        [--repeat 2] [--duration 8700] [--digest] [--keep DIR]

Needs a C compiler and Python's headers (mypyc comes with the dev extra's mypy). Two lines of the
engine model are rewritten in the copy only, because mypyc refuses them where mypy accepts them
(PATCHES); the script stops if either is no longer found.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the modules a simulated turn runs through (harness/drivers/virtual.py's loop and what it calls);
#: the open-loop client stays interpreted (its record-sink Protocol has defaults mypyc refuses)
MODULES = [
    "harness/refengine/base.py",
    "harness/refengine/blocks.py",
    "harness/refengine/fused.py",
    "harness/refengine/kv.py",
    "harness/refengine/radix.py",
    "harness/refengine/request.py",
    "harness/refengine/scheduler.py",
    "harness/refengine/separate.py",
    "harness/refengine/sglang.py",
    "harness/refengine/vllm.py",
    "harness/drivers/virtual.py",
    "harness/client/closed.py",
    "harness/client/session.py",
    "harness/workload/blockdraw.py",
    "harness/workload/draws.py",
]

#: (file, text, replacement): a subclass may not narrow an attribute's declared type for mypyc (the
#: flavours' `kv`), and mypyc infers a local's type from its first assignment only
PATCHES = [
    ("harness/refengine/base.py", "    kv: KVMemory\n", "    kv: Any\n"),
    ("harness/refengine/base.py", "from typing import Protocol\n", "from typing import Any, Protocol\n"),
    ("harness/refengine/sglang.py", "    kv: TokenKV\n", ""),
    ("harness/refengine/vllm.py", "    kv: BlockKV\n", ""),
    (
        "harness/refengine/sglang.py",
        "        chunked = self.prefilling[0] if self.prefilling else None\n        items",
        "        chunked: Req | None = self.prefilling[0] if self.prefilling else None\n        items",
    ),
]

COPIED = ["harness", "analysis", "runs", "configs", "prereg", "slurm", "review", "provenance", "cli", "benchmarks"]

_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify
setup(name="agentload-compiled-bench", ext_modules=mypycify(sys.argv[3:], opt_level="3"),
      script_args=["build_ext", "--inplace"])
"""


def copy_tree(dest: Path) -> None:
    """The working tree's packages and configs (no virtual environments, results or caches)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.pyc")
    for name in COPIED:
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")


def patch(dest: Path) -> None:
    for rel, old, new in PATCHES:
        p = dest / rel
        text = p.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{rel}: the line this benchmark rewrites for mypyc is gone or repeated: {old!r}")
        p.write_text(text.replace(old, new))


def compile_tree(dest: Path) -> None:
    print(f"compiling {len(MODULES)} modules with mypyc in {dest} (about a minute) ...", flush=True)
    proc = subprocess.run(
        [sys.executable, "-c", _SETUP, "x", "x", *MODULES], cwd=dest, capture_output=True, text=True
    )  # argv[3:] are the modules
    if proc.returncode != 0:
        raise SystemExit(f"mypyc failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    built = sorted(dest.glob("harness/**/*.so"))
    if len(built) != len(MODULES):
        raise SystemExit(f"mypyc built {len(built)} extension modules, expected {len(MODULES)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cell", action="append", help="cell to play (default: sglang-a100-300k and vllm-a100-300k)")
    ap.add_argument("--repeat", type=int, default=2, help="alternating plays per tree (the least CPU time counts)")
    ap.add_argument("--duration", type=float, default=8700.0)
    ap.add_argument("--digest", action="store_true", help="also check records_digest's runs are byte-identical")
    ap.add_argument("--keep", help="build the compiled copy here and keep it (default: a temporary folder)")
    args = ap.parse_args(argv)
    cells = args.cell or ["sglang-a100-300k", "vllm-a100-300k"]
    tmp = None
    if args.keep:
        dest = Path(args.keep).resolve()
        if dest.exists():
            raise SystemExit(f"--keep {dest}: exists; give a new folder")
    else:
        tmp = tempfile.mkdtemp(prefix="agentload-compiled-")
        dest = Path(tmp) / "compiled"
    try:
        copy_tree(dest)
        patch(dest)
        compile_tree(dest)
        print("the first tree is this one, interpreted; 'compiled' is the same code built with mypyc", flush=True)
        for cell in cells:
            subprocess.run(
                [sys.executable, str(ROOT / "benchmarks" / "bench_sim.py"), "--cell", cell, "--against", str(dest),
                 "--repeat", str(args.repeat), "--duration", str(args.duration)],
                cwd=ROOT, check=True,
            )  # fmt: skip
        if args.digest:
            ref = dest.parent / "digest-interpreted.json"
            digest = [sys.executable, "benchmarks/records_digest.py"]
            subprocess.run([*digest, "--out", str(ref)], cwd=ROOT, check=True, capture_output=True)
            proc = subprocess.run([*digest, "--compare", str(ref)], cwd=dest, text=True, capture_output=True)
            print(proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:])
            if proc.returncode != 0:
                return 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
