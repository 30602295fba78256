"""A real vLLM 0.32 server on the CPU (and our emulator's vLLM dialect) through the engine adapters:
the integration cases of engine_suite.py, which the real SGLang runs too.

Why a real engine in the test suite: the facts the experiment rests on (cached tokens reported
per request, hits at block granularity, a flush that really empties the cache, the pool the cell
asks for) are properties of the engine, not of our code; the emulator reproduces them, and
running the same tests against both is what keeps the emulator honest.

The vLLM cases need AGENTLOAD_VLLM_PYTHON (the engine venv's python; scripts/ci-engine-tests.sh
sets it up; AGENTLOAD_SKIP_VLLM=1 skips them) and use AGENTLOAD_TINY_MODEL when set (else the
model is built here). One server for the session (its start is 25-90 s on a 2-core machine);
`-m vllm` selects only the real-engine cases.

Scaled down for a CPU (a 40k-token prefill takes ~8 s there): a 32,768-token pool of 32-token
blocks (CPU attention needs multiples of 32), an 8,192-token context, so the smoke test's long
context check sends 8,191 tokens instead of the workload's 40,350 (it reports `capped`); the run
is 20 sessions of L0 256, Delta 64, d 16, up to 5 turns, tools of 0.5 s on average.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import engine_suite as suite
import pytest
from live_engines import EnginePool, Live

pytestmark = pytest.mark.timeout(1500)

ENGINES = [pytest.param("vllm", marks=pytest.mark.vllm, id="vllm"), pytest.param("emulator:vllm", id="emulator-vllm")]


@pytest.fixture(scope="module", params=ENGINES)
def live(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Iterator[Live]:
    yield engine_pool.get(request.param)
    engine_pool.stop(engine_pool.key(request.param))  # no other module needs it: free the cores


# Order matters: the first case needs a server that has not had a cache hit yet, and the last one
# kills the shared server.
def test_cached_counter_before_first_hit(live: Live) -> None:
    suite.case_cached_counter_before_first_hit(live)


def test_smoke(live: Live) -> None:
    suite.case_smoke(live)


def test_length_limits(live: Live) -> None:
    suite.case_length_limits(live)


def test_canary(live: Live) -> None:
    suite.case_canary(live)


def test_flush_refused_while_running(live: Live) -> None:
    suite.case_flush_refused_while_running(live)


def test_gauges_scraped_and_mapped(live: Live) -> None:
    suite.case_gauges_scraped_and_mapped(live)


def test_open_loop_run(live: Live, tmp_path: Path) -> None:
    suite.case_open_loop_run(live, tmp_path)


def test_run_real_attached(live: Live, tmp_path: Path) -> None:
    suite.case_run_real_attached(live, tmp_path)


def test_cli_run_attached(live: Live, tmp_path: Path) -> None:
    suite.case_cli_run_attached(live, tmp_path)


def test_calibration_stage_c(live: Live, tmp_path: Path) -> None:
    suite.case_calibration_stage_c(live, tmp_path)


def test_hung_server_times_out(live: Live, tmp_path: Path) -> None:
    suite.case_hung_server_times_out(live, tmp_path)


def test_sigterm_interrupts_an_attached_run(live: Live, tmp_path: Path) -> None:
    suite.case_sigterm_interrupts_an_attached_run(live, tmp_path)


def test_dead_server_fails_the_run(live: Live, tmp_path: Path) -> None:
    suite.case_dead_server_fails_the_run(live, tmp_path)
