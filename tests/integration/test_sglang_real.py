"""A real SGLang 0.5.22 server on the CPU (and our emulator's SGLang dialect) through the adapters:
every integration case the real vLLM runs (engine_suite.py), on SGLang.

Why: SGLang is the engine of most of the paper's tests. The facts the experiment rests on (cached
tokens per request with --enable-cache-report, hits of the previous prompt and output but its
last token in whole pages, a flush that empties the radix cache and refuses while a request runs,
the pool exactly --max-total-tokens) are the engine's; running the same cases on the emulator's
dialect keeps it honest. docs/sglang-cpu.md has what the real server answered and the differences
it showed from what our code assumed.

Needs AGENTLOAD_SGLANG_PYTHON (scripts/setup-sglang-cpu.sh prints it; scripts/ci-engine-tests.sh
sets it); AGENTLOAD_SKIP_SGLANG=1 skips the real engine. Two servers for the session (a start is
36-170 s on a 2-core machine): 1-token pages, the paper's setting, for most cases, and 32-token
pages (whole-page hits) for the SIGTERM and dead-server faults, booted in the background while the
first one's cases run. `-m sglang` selects only the real-engine cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import engine_suite as suite
import pytest
from live_engines import EnginePool, Live

pytestmark = pytest.mark.timeout(1500)

ENGINES = [
    pytest.param("sglang", marks=pytest.mark.sglang, id="sglang"),
    pytest.param("emulator:sglang", id="emulator-sglang"),
]
PAGE = 32  # the second server's page size


@pytest.fixture(scope="module", params=ENGINES)
def live(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Iterator[Live]:
    server = engine_pool.get(request.param)
    engine_pool.prestart(request.param, PAGE)  # boots while the 1-token-page cases run
    yield server
    engine_pool.stop(engine_pool.key(request.param))  # no other module needs it: free the cores


@pytest.fixture(scope="module", params=ENGINES)
def live32(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Iterator[Live]:
    server = engine_pool.get(request.param, PAGE)
    yield server
    engine_pool.stop(engine_pool.key(request.param, PAGE))


# Order matters: the first case needs a server that has not had a cache hit yet, and the last one
# kills its server.
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


def test_sigterm_interrupts_an_attached_run_page_32(live32: Live, tmp_path: Path) -> None:
    """Also the canary on 32-token pages (992 before the flush, 0 after) and open-loop follow-ups
    hitting whole pages: 128 + 16 -> 128, 176 + 16 -> 160."""
    suite.case_sigterm_interrupts_an_attached_run(live32, tmp_path)


def test_dead_server_fails_the_run_page_32(live32: Live, tmp_path: Path) -> None:
    suite.case_dead_server_fails_the_run(live32, tmp_path)
