"""A real SGLang 0.5.22 server on the CPU (and our emulator's SGLang dialect) through the adapters:
every integration case the real vLLM runs (engine_suite.py), on SGLang.

Why: SGLang is the engine of most of the paper's tests. The facts the experiment rests on (cached
tokens per request with --enable-cache-report, hits of the previous prompt and output but its
last token in whole pages, a flush that empties the radix cache and refuses while a request runs,
the pool exactly --max-total-tokens) are the engine's; running the same cases on the emulator's
dialect keeps it honest. docs/sglang-cpu.md has what the real server answered and the differences
it showed from what our code assumed.

Needs AGENTLOAD_SGLANG_PYTHON (scripts/setup-sglang-cpu.sh prints it; scripts/ci-engine-tests.sh
sets it); AGENTLOAD_SKIP_SGLANG=1 skips the real engine. One server for the session (its start is
36-170 s on a 2-core machine), with 1-token pages, the paper's setting; the launched-run case
starts one more with 32-token pages (whole-page hits), through `agentload run`. `-m sglang`
selects only the real-engine cases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import engine_suite as suite
from live_engines import EnginePool, Live

pytestmark = pytest.mark.timeout(1500)

ENGINES = [pytest.param("sglang", marks=pytest.mark.sglang, id="sglang"), pytest.param("emulator:sglang", id="emulator-sglang")]


@pytest.fixture(scope="module", params=ENGINES)
def live(request: pytest.FixtureRequest, engine_pool: EnginePool) -> Live:
    return engine_pool.get(request.param)


# Order matters: the first case needs a server that has not had a cache hit yet, and the last one
# kills the shared server.
def test_cached_counter_before_first_hit(live: Live) -> None:
    suite.case_cached_counter_before_first_hit(live)


def test_smoke(live: Live) -> None:
    suite.case_smoke(live)


def test_longest_prompt_is_the_engines(live: Live) -> None:
    suite.case_longest_prompt_is_the_engines(live)


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


def test_sigterm_interrupts_a_launched_run_page_32(live: Live, tmp_path: Path) -> None:
    suite.case_sigterm_interrupts_a_launched_run(live, tmp_path, page_size=32)


def test_dead_server_fails_the_run(live: Live, tmp_path: Path) -> None:
    suite.case_dead_server_fails_the_run(live, tmp_path)
