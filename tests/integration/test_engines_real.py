"""Real vLLM 0.32 and SGLang 0.5.22 servers on the CPU, and our emulator in either engine's dialect,
through the engine adapters: every integration case (engine_suite.py, engine_runs.py,
engine_faults.py) on every engine.

Why real engines in the test suite: the facts the experiment rests on (cached tokens reported per
request, hits of the previous prompt and output but its last token in whole pages or blocks, a
flush that really empties the cache and, on SGLang, refuses while a request runs, the pool the
cell asks for) are properties of the engine, not of our code; the emulator reproduces them, and
running the same cases against both is what keeps the emulator honest. docs/sglang-cpu.md has what
the real SGLang answered and where it differed from what our code assumed.

Needs AGENTLOAD_VLLM_PYTHON / AGENTLOAD_SGLANG_PYTHON (the engine venvs' pythons;
scripts/ci-engine-tests.sh sets them up; AGENTLOAD_SKIP_VLLM=1 / AGENTLOAD_SKIP_SGLANG=1 skip an
engine) and uses AGENTLOAD_TINY_MODEL when set (else the model is built). `-m vllm` / `-m sglang`
select one real engine's cases. The servers are the session's (live_engines.py): a start is 25-170 s
on a 2-core machine. vLLM runs 32-token blocks (its CPU attention needs multiples of 32) and its
fault cases on the same server; SGLang runs 1-token pages, the paper's setting, and its fault cases
on a second server of 32-token pages (whole-page hits), booted in the background while the first
one's cases run.

Scaled down for a CPU (a 40k-token prefill takes ~8 s there): a 32,768-token pool, an 8,192-token
context, so the smoke test's long-context check sends at most 8,191 tokens instead of the
workload's 40,350 (it reports `capped`); the runs are tens of sessions of L0 128-256, Delta 32-64,
d 16, up to 5-6 turns, tools of 0.3-0.5 s on average.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import engine_faults as faults
import engine_runs as runs
import engine_suite as suite
import pytest
from live_engines import FAULT_PAGE, EnginePool, Live, flavor_of

pytestmark = [pytest.mark.timeout(1500), pytest.mark.wallclock]

ENGINES = [
    pytest.param("sglang", marks=pytest.mark.sglang, id="sglang"),
    pytest.param("emulator:sglang", id="emulator-sglang"),
    pytest.param("vllm", marks=pytest.mark.vllm, id="vllm"),
    pytest.param("emulator:vllm", id="emulator-vllm"),
]


@pytest.fixture(scope="module", params=ENGINES)
def live(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Iterator[Live]:
    """The engine's server for the module's cases (stopped after them: no other module needs it)."""
    engine = request.param
    server = engine_pool.get(engine)
    page = FAULT_PAGE.get(flavor_of(engine))
    if page is not None:
        engine_pool.prestart(engine, page)  # boots while the first server's cases run
    yield server
    engine_pool.stop(engine_pool.key(engine))
    if page is not None:
        engine_pool.stop(engine_pool.key(engine, page))


@pytest.fixture()
def fault_live(live: Live, engine_pool: EnginePool) -> Live:
    """The server the fault cases may hang, interrupt and kill: SGLang's 32-token-page one (also
    the canary on 32-token pages, 992 before the flush and 0 after, and follow-ups hitting whole
    pages: 128 + 16 -> 128, 176 + 16 -> 160), vLLM's own."""
    page = FAULT_PAGE.get(flavor_of(live.engine))
    return live if page is None else engine_pool.get(live.engine, page)


# Order matters: the first case needs a server that has not had a cache hit yet, and the last one
# kills the fault server.
def test_cached_counter_before_first_hit(live: Live) -> None:
    suite.case_cached_counter_before_first_hit(live)


def test_smoke(live: Live) -> None:
    suite.case_smoke(live)


def test_length_limits(live: Live) -> None:
    suite.case_length_limits(live)


def test_canary(live: Live) -> None:
    suite.case_canary(live)


# The real vLLM's case runs alone, in the quiet phase (test_engine_flush.py says why).
@pytest.mark.parametrize("live", [e for e in ENGINES if e.id != "vllm"], indirect=True)
def test_flush_refused_while_running(live: Live) -> None:
    suite.case_flush_refused_while_running(live)


def test_gauges_scraped_and_mapped(live: Live) -> None:
    suite.case_gauges_scraped_and_mapped(live)


def test_open_loop_run(live: Live, tmp_path: Path) -> None:
    runs.case_open_loop_run(live, tmp_path)


def test_run_real_attached(live: Live, tmp_path: Path) -> None:
    runs.case_run_real_attached(live, tmp_path)


def test_cli_run_attached(live: Live, tmp_path: Path) -> None:
    runs.case_cli_run_attached(live, tmp_path)


def test_calibration_stage_c(live: Live, tmp_path: Path) -> None:
    runs.case_calibration_stage_c(live, tmp_path)


def test_hung_server_times_out(live: Live, tmp_path: Path) -> None:
    faults.case_hung_server_times_out(live, tmp_path)


def test_sigterm_interrupts_an_attached_run(fault_live: Live, tmp_path: Path) -> None:
    faults.case_sigterm_interrupts_an_attached_run(fault_live, tmp_path)


def test_dead_server_fails_the_run(fault_live: Live, tmp_path: Path) -> None:
    faults.case_dead_server_fails_the_run(fault_live, tmp_path)
