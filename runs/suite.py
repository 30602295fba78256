"""Several tests in one pool of worker processes: `agentload test run A.yaml B.yaml ... --jobs N`.

Tests run one after another leave workers idle twice per test: while its last, longest runs
finish on fewer workers than there are, and while its verdict, tables and figure are written. One
pool for the runs of every test keeps each worker busy to the end: a test's runs go in (slowest
first, as `run_test` orders them) right behind the previous test's, and each test is scored in
this process as soon as its own runs are done, while the workers go on with later tests' runs.
Every run is the same call as in `run_test` (`_worker`), into the same folder layout, so a
test's records, verdict and report are those a `test run` of it alone writes.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import queue as queue_mod
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.config import TestBundle, load_test
from harness.errors import ConfigError
from harness.recording.schema import RunStatus
from runs.arms import Observer, RunResult, check_before_runs, execute_run, planned_runs, refuse_existing_runs, run_name
from runs.shared_sims import clone_run, sim_key

log = logging.getLogger("agentload.runner")


@dataclass
class SuiteTest:
    """One test of a suite: where its runs go and what came back."""

    bundle: TestBundle
    out: Path
    options: dict[str, Any] | None = None
    todo: list[tuple[str, float, int]] = field(default_factory=list)
    results: list[RunResult] = field(default_factory=list)
    started: float = float("nan")  # monotonic time its first run was handed to the pool
    wall_s: float = float("nan")  # from then until its last run came back


def run_suite(
    tests: Sequence[SuiteTest],
    engine: str,
    *,
    jobs: int | None = None,
    every: float = 50.0,
    on_run_done: Callable[[SuiteTest, RunResult, int, int], None] | None = None,
    on_test_done: Callable[[SuiteTest], None] | None = None,
    share: bool = True,
) -> list[SuiteTest]:
    """Run every arm x rate x seed of every test in one pool of `jobs` processes.

    Each test's runs go to test.out/<arm>-r<rate>-s<seed>/. `on_run_done(test, result, done,
    total)` is called as each run comes back, `on_test_done(test)` once a test's last run has
    (its results sorted as `run_test` sorts them). Everything that would fail in every run fails
    before the first starts: a test's engine backend, references and rule expectations, and an
    output folder that already holds a run. `share`: runs of different tests that are one
    simulation are played once (drive_pool)."""
    names = [t.bundle.test.name for t in tests]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ConfigError(f"tests: {', '.join(dup)} given more than once; expected each test once")
    for t in tests:
        check_before_runs(t.bundle, engine, None)
        t.todo = planned_runs(t.bundle)
        refuse_existing_runs(t.out, t.todo)
    drive_pool(tests, engine, jobs=jobs, every=every, on_run_done=on_run_done, on_test_done=on_test_done, share=share)
    return list(tests)


def drive_pool(
    tests: Sequence[SuiteTest],
    engine: str,
    *,
    jobs: int | None = None,
    every: float = 50.0,
    display: Any = None,
    on_run_done: Callable[[SuiteTest, RunResult, int, int], None] | None = None,
    on_test_done: Callable[[SuiteTest], None] | None = None,
    share: bool = True,
) -> None:
    """Run each test's `todo` in one local pool (the checks are the caller's: `run_suite`, or
    `run_test` for one test). `display` (TestDisplay) gets the runs' progress and ends, keyed by
    run name; results land in each test's `results`, sorted once the test is done.

    `share`: a simulated run with the inputs of one already handed to the pool (another test's:
    runs/shared_sims.py) is not played again; once that run has completed, its records are copied
    into this run's folder, which says so in meta.json (a run that did not complete is not shared:
    the runs waiting on it are played after all)."""
    total = sum(len(t.todo) for t in tests)
    jobs = max(1, min(jobs or os.cpu_count() or 1, total))
    ctx = mp.get_context("fork" if hasattr(os, "fork") else "spawn")
    q = ctx.Queue()
    left = {id(t): len(t.todo) for t in tests}
    done = 0

    def settle(t: SuiteTest, a: str, r: float, s: int, res: RunResult) -> None:
        nonlocal done
        t.results.append(res)
        if display is not None:
            display.finished(run_name(a, r, s), res)
        done += 1
        if on_run_done is not None:
            on_run_done(t, res, done, total)
        left[id(t)] -= 1
        if left[id(t)] == 0:
            t.wall_s = time.monotonic() - t.started
            t.results.sort(key=lambda x: (x.rate, x.arm, x.seed))
            if on_test_done is not None:
                on_test_done(t)  # scored here while the workers run later tests

    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init_worker, initargs=(q,)) as pool:
        futs: dict[Future[RunResult], tuple[SuiteTest, str, float, int]] = {}
        keyed: dict[Future[RunResult], str] = {}  # a played run -> its simulation's key
        waiting: dict[str, list[tuple[SuiteTest, str, float, int]]] = {}  # key -> runs that share its records

        def submit(t: SuiteTest, a: str, r: float, s: int) -> Future[RunResult]:
            run_dir = str(t.out / run_name(a, r, s))
            f = pool.submit(_worker, str(t.bundle.path), a, r, s, engine, run_dir, every, t.options)
            futs[f] = (t, a, r, s)
            return f

        for t in tests:  # in the order given: the pool takes them first come, first served
            t.out.mkdir(parents=True, exist_ok=True)
            t.started = time.monotonic()
            for a, r, s in t.todo:
                key = sim_key(t.bundle, a, r, s, engine, t.options) if share else None
                if key is not None and key in waiting:
                    waiting[key].append((t, a, r, s))
                    continue
                f = submit(t, a, r, s)
                if key is not None:
                    keyed[f] = key
                    waiting[key] = []
        pending = set(futs)
        while pending:
            _drain(q, display)
            finished = [f for f in pending if f.done()]
            for f in finished:
                pending.discard(f)
                t, a, r, s = futs[f]
                try:
                    res = f.result()
                except Exception as exc:  # the worker process itself died
                    res = RunResult(
                        str(t.out / run_name(a, r, s)),
                        a,
                        r,
                        s,
                        RunStatus.FAILED,
                        f"worker died: {exc!r}",
                        0.0,
                        float("nan"),
                    )
                settle(t, a, r, s, res)
                key = keyed.get(f)
                if key is None:
                    continue
                for t2, a2, r2, s2 in waiting.pop(key, []):
                    try:
                        shared = clone_run(res, t2.bundle, t2.out / run_name(a2, r2, s2), key)
                    except (OSError, ValueError) as exc:  # not completed, or not copied: play it
                        log.info("%s: played, not shared (%s)", t2.out / run_name(a2, r2, s2), exc)
                        pending.add(submit(t2, a2, r2, s2))
                        continue
                    settle(t2, a2, r2, s2, shared)
            if pending:
                time.sleep(0.2)
    _drain(q, display)  # after the workers exited: whatever they posted last


_QUEUE: Any = None


def _init_worker(q: Any) -> None:
    global _QUEUE
    _QUEUE = q


def _post(msg: dict[str, Any]) -> None:
    if _QUEUE is not None:
        with contextlib.suppress(Exception):  # a full or closed queue must never kill a run
            _QUEUE.put_nowait(msg)


def _worker(
    test_path: str,
    arm: str,
    rate: float,
    seed: int,
    engine: str,
    run_dir: str,
    every: float,
    options: dict[str, Any] | None,
) -> RunResult:
    bundle = load_test(test_path)
    key = run_name(arm, rate, seed)
    try:
        res = execute_run(
            bundle, arm, rate, seed, engine, run_dir, observer=Observer(key, _post, every), options=options
        )
    except Exception as exc:
        _post({"key": key, "done": True, "status": RunStatus.FAILED})
        tb = traceback.format_exc(limit=8)
        return RunResult(
            run_dir, arm, rate, seed, RunStatus.FAILED, f"{type(exc).__name__}: {exc}", 0.0, float("nan"), detail=tb
        )
    _post({"key": key, "done": True, "status": res.status, "wall": res.wall_s})
    return res


def run_test(
    test_path: str | Path,
    engine: str,
    out_dir: Path | str,
    *,
    jobs: int | None = None,
    display: Any = None,
    every: float = 50.0,
    options: dict[str, Any] | None = None,
    rule: Any = None,
    executor: Any = None,
) -> list[RunResult]:
    """Run every arm x rate x seed of a test into out_dir/<arm>-r<rate>-s<seed>/ in `jobs` processes.

    `options` reach the engine backend (RunContext.options), e.g. real-engine launch settings;
    `rule` is the rule the verdict will use (a spec file, a dict, or None for the registered E2
    rule): every arm must have an expectation in it before any run starts. `executor`, when
    given, runs the runs elsewhere instead of the local process pool: an object whose
    `map(fn, calls, labels)` returns outcomes with `ok`, `value`, `error` (slurm.sweep.SlurmSweep:
    one SLURM job array)."""
    bundle = load_test(test_path)
    check_before_runs(bundle, engine, rule)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    todo = planned_runs(bundle)
    refuse_existing_runs(out, todo)
    if executor is not None:
        return _run_elsewhere(bundle, engine, out, todo, every, options, executor)
    if display is not None:
        display.start([run_name(a, r, s) for a, r, s in todo], bundle.protocol.duration)
    test = SuiteTest(bundle, out, options, todo=todo)
    drive_pool([test], engine, jobs=jobs, every=every, display=display)
    if display is not None:
        display.stop()
    return test.results


def _run_elsewhere(
    bundle: TestBundle,
    engine: str,
    out: Path,
    todo: list[tuple[str, float, int]],
    every: float,
    options: dict[str, Any] | None,
    executor: Any,
) -> list[RunResult]:
    """The runs of a test through an executor (each call is `_worker`, as in the local pool)."""
    test_path = str(Path(bundle.path).resolve()) if bundle.path else None
    if test_path is None:
        raise ConfigError(f"test {bundle.test.name!r}: running it through an executor needs its test file")
    calls = [(test_path, a, r, s, engine, str((out / run_name(a, r, s)).resolve()), every, options) for a, r, s in todo]
    outcomes = executor.map(_worker, calls, labels=[run_name(a, r, s) for a, r, s in todo])
    results = []
    for (a, r, s), o in zip(todo, outcomes):
        if o.ok:
            results.append(o.value)
        else:
            results.append(
                RunResult(
                    str(out / run_name(a, r, s)), a, r, s, RunStatus.FAILED, f"job failed: {o.error}", 0.0, float("nan")
                )
            )
    return sorted(results, key=lambda x: (x.rate, x.arm, x.seed))


def _drain(q: Any, display: Any) -> None:
    while True:
        try:
            msg = q.get_nowait()
        except (queue_mod.Empty, OSError, ValueError):
            return
        if display is not None and "t" in msg:
            display.update(msg)
