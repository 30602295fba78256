"""Work handed to forked copies of the command (analysis/forking.py, analysis/figure_process.py):
the same results, in the same order, as doing it in one process, and the parent doing any share a
child failed.

The verdict and figure of the committed 18-run evidence test are scored and drawn both ways and
compared byte for byte.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import orjson
import pytest

from analysis import figure_process as fp
from analysis import forking
from analysis.figure_process import FigureProcess
from analysis.forking import can_fork, forked_map, shares
from analysis.reports import write_report
from analysis.rules import load_rule
from analysis.staged_analysis import analyze_staged

ROOT = Path(__file__).resolve().parents[3]
RUNS = ROOT / "evidence" / "e2-vllm-cpu-tiny-65k-quarter" / "test" / "runs"
RULE = "e2-cpu-65k-quarter"

needs_fork = pytest.mark.skipif(not can_fork(), reason="this platform or process cannot fork safely")


def _pid_of(_: int) -> int:
    return os.getpid()


def test_shares_cover_every_item_once_in_order_and_none_below_the_minimum() -> None:
    for n in range(0, 40):
        for workers in (1, 2, 3, 8):
            parts = shares(n, workers)
            assert [i for p in parts for i in p] == list(range(n))
            assert len(parts) <= max(1, workers)
            if len(parts) > 1:
                assert min(len(p) for p in parts) >= forking.MIN_SHARE
                assert max(len(p) for p in parts) - min(len(p) for p in parts) <= 1
    assert len(shares(18, 2)) == 2 and len(shares(7, 2)) == 1  # 3 each would not pay


@needs_fork
def test_forked_map_keeps_order_and_uses_children() -> None:
    items = list(range(23))
    assert forked_map(lambda x: x * x, items, 3) == [x * x for x in items]
    pids = forked_map(_pid_of, items, 2)
    assert pids[0] == os.getpid() and pids[-1] != os.getpid()  # the second share came from a child
    assert forked_map(lambda x: x, [], 4) == []


@needs_fork
def test_a_share_a_child_fails_is_done_by_the_parent() -> None:
    parent = os.getpid()

    def only_here(x: int) -> int:
        if os.getpid() != parent:
            raise RuntimeError("the child fails")
        return x + 1

    assert forked_map(only_here, list(range(12)), 2) == list(range(1, 13))

    def unpicklable(x: int) -> object:
        return (lambda: x) if os.getpid() != parent else x  # a child's result cannot come back

    got = forked_map(unpicklable, list(range(10)), 2)
    assert got == list(range(10))


@needs_fork
def test_no_fork_while_other_threads_run() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not can_fork()
        assert set(forked_map(_pid_of, list(range(16)), 4)) == {os.getpid()}
    finally:
        stop.set()
        t.join()


@needs_fork
def test_forked_scoring_and_figure_are_those_of_one_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = sorted(str(p.parent) for p in RUNS.glob("*/meta.json"))
    assert len(dirs) == 18
    spec = load_rule(RULE, None)
    one, analyzed1 = analyze_staged(dirs, spec, arms=None, rates=None, seeds=None, workers=1)
    two, analyzed2 = analyze_staged(dirs, spec, arms=None, rates=None, seeds=None, workers=2)
    opt = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS
    assert orjson.dumps(one, option=opt) == orjson.dumps(two, option=opt)
    assert [a.run.run_dir for a in analyzed2] == dirs

    here, _ = write_report(one, analyzed1, tmp_path / "here")
    parent, real, drawn_here = os.getpid(), fp.draw_in_process, []

    def counted(*args: object) -> Path:
        if os.getpid() == parent:
            drawn_here.append(args)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fp, "draw_in_process", counted)
    figures = FigureProcess.start()
    assert figures is not None
    with figures:
        there, _ = write_report(two, analyzed2, tmp_path / "there", figures=figures)
        again, _ = write_report(two, analyzed2, tmp_path / "again", figures=figures)  # a second test's
    assert figures.failure is None and not drawn_here  # the child drew both
    assert here["figure"].read_bytes() == there["figure"].read_bytes() == again["figure"].read_bytes()
    assert here["verdict"].read_bytes() == there["verdict"].read_bytes()


@needs_fork
def test_a_figure_the_child_fails_to_draw_is_drawn_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dirs = sorted(str(p.parent) for p in RUNS.glob("*/meta.json"))[:3]
    verdict, analyzed = analyze_staged(dirs, load_rule(RULE, None), arms=None, rates=None, seeds=None)
    parent, real = os.getpid(), fp.draw_in_process

    def child_fails(*args: object) -> Path:
        if os.getpid() != parent:
            raise RuntimeError("no canvas in the child")
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(fp, "draw_in_process", child_fails)  # before the fork: the child has it too
    figures = FigureProcess.start()
    assert figures is not None
    with figures:
        paths, _ = write_report(verdict, analyzed, tmp_path / "a", figures=figures)
        assert figures.failure is not None and "no canvas in the child" in figures.failure
        later, _ = write_report(verdict, analyzed, tmp_path / "b", figures=figures)  # drawn here too
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert later["figure"].read_bytes() == paths["figure"].read_bytes()


@needs_fork
def test_a_figure_process_never_asked_ends_with_its_parent() -> None:
    figures = FigureProcess.start()
    assert figures is not None
    pid = figures.pid
    with figures:
        pass
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left
