"""The engine model's speed against its direct formulation, on the same runs, in one process.

The batched block pool (harness/refengine/blocks.py), the decode fast path of BlockKV and the
reset per-thread generator of a turn's ids (harness/workload/draws.py) replaced one-block-at-a-time
and build-per-call code; then fused vLLM decode steps (harness/refengine/fused.py), lookups that
start from a session's last turn (BlockKV._history), SGLang's decode reservation kept as it
changes, the radix admission check without lock/unlock, Philox keys without a SeedSequence and
in-place output ids replaced stepping one at a time, full lookups and direct sums; then the radix
tree's touches and locks per path segment (tests/radix_reference.py keeps the direct form), SGLang
lookups from a session's last turn, checkpoints without copies and a session's turn keys derived
from what they share replaced node-by-node walks, root walks, copies and a key per turn; then a
session's ids drawn in one block (harness/workload/blockdraw.py) replaced a bounded draw per turn
(the direct forms are kept below and in tests/unit/harness/test_refengine_fastpaths.py and
test_draw_fastpaths.py). This benchmark plays a fixed set of
runs of the registered tests twice: once with the reference code swapped in
(tests/blockpool_reference.py's pool, the former BlockKV methods and token generator, kept below),
once as the code is, alternating, and checks that every
record (turns, sessions, gauges, gate events) is byte-identical. It prints CPU seconds per run
(the least of --repeat alternating plays per side: the machine is shared) and the ratio, and
writes benchmarks/refengine.json.

    nice -n 19 .venv/bin/python benchmarks/bench_refengine.py [--quick] [--repeat 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support"), str(ROOT / "tests" / "unit" / "harness")]

from blockpool_reference import BlockPool as ReferencePool  # noqa: E402
from radix_reference import RadixCache as ReferenceRadix  # noqa: E402
from test_draw_fastpaths import _direct_output_ids, _direct_output_ids_of, _numpy_key  # noqa: E402
from test_refengine_fastpaths import _direct_decode_left  # noqa: E402

from harness.client import session as sessionmod  # noqa: E402
from harness.config import load_test  # noqa: E402
from harness.recording.schema import RunStatus  # noqa: E402
from harness.refengine import kv as kvmod  # noqa: E402
from harness.refengine import model as modelmod  # noqa: E402
from harness.refengine import request as requestmod  # noqa: E402
from harness.refengine import sglang as sglangmod  # noqa: E402
from harness.workload import draws  # noqa: E402
from runs.arms import execute_run  # noqa: E402

# (test config, arm, rate, seed): vLLM trapped and good, SGLang trapped
RUNS = [
    ("configs/tests/e2-vllm-300k.yaml", "burst", 1.65, 0),
    ("configs/tests/e2-vllm-300k.yaml", "noburst", 1.35, 1),
    ("configs/tests/e2-sglang-300k.yaml", "burst", 1.65, 0),
    ("configs/tests/e2-sglang-300k.yaml", "noburst", 1.35, 1),
]
RECORDS = ("turns.parquet", "sessions.parquet", "gauges.parquet", "gate_events.parquet")


# -- the former BlockKV methods (before the decode fast path) ---------------------------------------
def _ref_keys(self: Any, req: Any, nblocks: int) -> list[int]:
    if req.keys_len < 0:
        total = req.L + req.max_tokens
        req.keys = self.pool.hasher.keys(np.concatenate((req.prompt, req.out))[:total], total // self.B)
        req.keys_len = total
    return req.keys[:nblocks]


def _ref_cache_full(self: Any, req: Any, tokens: int) -> None:
    nfull = tokens // self.B
    if self.caching and nfull > req.ncached:
        self.pool.register(req.blocks[req.ncached : nfull], self._keys(req, nfull)[req.ncached :])
        req.ncached = nfull


def _ref_match(self: Any, req: Any, touch: bool = True) -> int:
    if not self.caching:
        req.hit = []
        return 0
    maxb = (req.target - 1) // self.B
    req.hit = self.pool.lookup(self._keys(req, maxb), maxb)
    return len(req.hit) * self.B


def _ref_grow_req(self: Any, req: Any, tokens: int) -> bool:
    need = self._new_blocks(req, tokens)
    if need > self.pool.free_count():
        return False
    if need:
        req.blocks.extend(self.pool.allocate(need))
    self._cache_full(req, tokens)
    return True


def _ref_alloc(self: Any, req: Any, n: int) -> bool:
    """The former alloc: the former grow_req's taking of blocks, for a prefill chunk of n tokens."""
    return _ref_grow_req(self, req, req.done + n)


def _ref_finish(self: Any, req: Any) -> None:
    self._free(req, req.L + req.max_tokens - 1)


# -- the former TokenKV methods (before lookups from the last turn and checkpoints without copies) ----
def _ref_token_match(self: Any, req: Any, touch: bool = True) -> int:
    if not self.caching:
        req.node = None
        return 0
    n, node = self.tree.match(req.seq_bytes(), req.target - 1, touch)
    req.node = node
    return n


def _ref_token_touch(self: Any, req: Any) -> None:
    if self.caching:
        self.tree.match(req.seq_bytes(), req.target - 1, True)


def _ref_checkpoint(self: Any, req: Any, upto: int) -> None:
    if not self.caching:
        return
    aligned = (upto // self.page) * self.page
    if aligned <= req.in_tree:
        return
    seq = req.pb if aligned <= req.L else req.pb + req.outb[: (aligned - req.L) * 4]
    if req.node is not None and req.in_tree > 0:
        _new, node = self.tree.insert_from(req.node, req.in_tree, seq[: aligned * 4])
    else:
        _new, node = self.tree.insert(seq[: aligned * 4])
    self.own -= aligned - req.in_tree
    self.tree.lock(node)
    if req.node is not None:
        self.tree.unlock(req.node)
    req.node = node
    req.in_tree = aligned


def _ref_token_finish(self: Any, req: Any) -> None:
    kept = req.L + req.max_tokens - 1
    self.checkpoint(req, kept)
    self.own -= kept - req.in_tree
    if req.node is not None:
        self.tree.unlock(req.node)
    req.node = None
    req.in_tree = 0


def _ref_turn_generator(token_seed: int, turn: int) -> Any:
    """A turn's generator built afresh from numpy's SeedSequence (the first formulation)."""
    return draws._generator(draws._TOKEN_DOMAIN, token_seed & 0xFFFFFFFF, token_seed >> 32, turn)


def _ref_session_turn_ids(workload: Any, spec: Any) -> list[Any]:
    """A session's ids drawn turn by turn with numpy's bounded draw (before the block draw)."""
    return [draws.turn_tokens(workload, spec, k) for k in range(1, spec.n_turns + 1)]


def _ref_free_and_evictable(self: Any, req: Any = None) -> int:
    node = req.node if req is not None else None
    if node is None or not self.caching:
        return self.free_slots() + self.tree.evictable
    self.tree.lock(node)
    ev = self.tree.evictable
    self.tree.unlock(node)
    return self.free_slots() + ev


def _ref_fits(self: Any, req: Any, need: int) -> bool:
    """The former admission test, before its bound from the path's depth (the reference radix
    tree keeps no depths)."""
    return bool(need < self.free_and_evictable(req))


# (module or class, attribute, reference formulation)
SWAPS: list[tuple[Any, str, Any]] = [
    (kvmod, "BlockPool", ReferencePool),
    (kvmod.BlockKV, "_keys", _ref_keys),
    (kvmod.BlockKV, "_cache_full", _ref_cache_full),
    (kvmod.BlockKV, "match", _ref_match),
    (kvmod.BlockKV, "grow_req", _ref_grow_req),
    (kvmod.BlockKV, "alloc", _ref_alloc),
    (kvmod.BlockKV, "finish", _ref_finish),
    (kvmod.TokenKV, "free_and_evictable", _ref_free_and_evictable),
    (kvmod.TokenKV, "fits", _ref_fits),
    (kvmod, "RadixCache", ReferenceRadix),
    (kvmod.TokenKV, "match", _ref_token_match),
    (kvmod.TokenKV, "touch", _ref_token_touch),
    (kvmod.TokenKV, "checkpoint", _ref_checkpoint),
    (kvmod.TokenKV, "finish", _ref_token_finish),
    (modelmod, "plan_fused_decode", lambda *_a: None),
    (sglangmod.SGLangEngine, "_decode_offset", _direct_decode_left),
    (requestmod, "output_ids", _direct_output_ids),
    (requestmod, "output_ids_of", _direct_output_ids_of),  # what a request calls (Req.__init__)
    (draws, "_turn_generator", _ref_turn_generator),
    (sessionmod, "session_turn_ids", _ref_session_turn_ids),
    (draws, "_philox_key", _numpy_key),
]


@contextmanager
def reference_code() -> Iterator[None]:
    """Swap the reference formulation in (and back out)."""
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ref in SWAPS]
    for obj, name, ref in SWAPS:
        setattr(obj, name, ref)
    try:
        yield
    finally:
        for obj, name, old in saved:
            setattr(obj, name, old)


def one(test: str, arm: str, rate: float, seed: int, out: Path) -> float:
    bundle = load_test(ROOT / test)
    c0 = time.process_time()
    res = execute_run(bundle, arm, rate, seed, "sim", out)
    cpu = time.process_time() - c0
    if res.status != RunStatus.COMPLETED:
        raise SystemExit(f"{test} {arm} {rate} {seed}: {res.status}: {res.reason}")
    return cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="only the SGLang run and the vLLM good run")
    ap.add_argument("--repeat", type=int, default=2, help="plays of each run per side (the minimum CPU time counts)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "refengine.json"))
    args = ap.parse_args(argv)
    runs = RUNS[1:] if args.quick else RUNS
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-refengine-") as tmp:
        for i, (test, arm, rate, seed) in enumerate(runs):
            refs, news = [], []
            for k in range(args.repeat):  # alternating, so a change in the machine's load hits both alike
                d_ref, d_new = Path(tmp) / f"{i}-{k}-ref", Path(tmp) / f"{i}-{k}-new"
                with reference_code():
                    refs.append(one(test, arm, rate, seed, d_ref))
                news.append(one(test, arm, rate, seed, d_new))
            t_ref, t_new = min(refs), min(news)  # the least disturbed of the repeats
            same = all((d_ref / f).read_bytes() == (d_new / f).read_bytes() for f in RECORDS)
            turns = pq.read_metadata(d_new / "turns.parquet").num_rows
            row = {
                "test": Path(test).stem,
                "arm": arm,
                "rate": rate,
                "seed": seed,
                "turns": turns,
                "reference_cpu_s": round(t_ref, 2),
                "cpu_s": round(t_new, 2),
                "ratio": round(t_ref / t_new, 2),
                "records_identical": same,
                "reference_cpu_all_s": [round(x, 2) for x in refs],
                "cpu_all_s": [round(x, 2) for x in news],
            }
            rows.append(row)
            print(
                f"{row['test']:<16} {arm:<8} {rate:4} s{seed}  {turns:6} turns  reference {t_ref:6.1f} s CPU  now "
                f"{t_new:6.1f} s CPU  "
                f"x{row['ratio']:.2f}  records {'identical' if same else 'DIFFER'}",
                flush=True,
            )
    tot_ref = sum(r["reference_cpu_s"] for r in rows)
    tot_new = sum(r["cpu_s"] for r in rows)
    result = {
        "benchmark": "refengine",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "load_avg": os.getloadavg()},
        "runs": rows,
        "reference_cpu_s": round(tot_ref, 2),
        "cpu_s": round(tot_new, 2),
        "ratio": round(tot_ref / tot_new, 2),
        "all_identical": all(r["records_identical"] for r in rows),
    }
    print(
        f"total: reference {tot_ref:.1f} s CPU, now {tot_new:.1f} s CPU: x{result['ratio']:.2f}; records identical: "
        f"{result['all_identical']}"
    )
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["all_identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
