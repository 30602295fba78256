"""The real vLLM refuses to flush its prefix cache while a request runs: its case, run alone.

Why alone (the `quiet` marker: scripts/test-phases.sh runs it before every other session starts):
on a 2-core machine shared with other work, the CPU vLLM's API server answered nothing while the
engine decoded. Measured with three busy loops beside it: in 5 tries of 5, no /metrics read showed
a 7,000-token request running during its 34 s decode (one saw it as it ended), and one read took
7.4 s; in a CI session the gauge first showed a 1,024-token request at 4.8-5.0 s, as it ended. The
flush was then answered after the request (success true, nothing refused). The likely reason: the
API server turns the engine's per-token outputs into the answer on the same event loop that serves
/metrics and the flush, and with a fraction of a core it falls behind them until the request ends.
With the machine to itself the request was seen running 0.7-1.2 s after it was sent, and the flush
was refused at once. SGLang's and the emulators' cases run with the other engine cases
(test_engines_real.py).
"""

from __future__ import annotations

import engine_suite as suite
import pytest
from live_engines import EnginePool

pytestmark = [pytest.mark.vllm, pytest.mark.quiet, pytest.mark.wallclock, pytest.mark.timeout(900)]


def test_the_real_vllm_refuses_a_flush_while_a_request_runs(engine_pool: EnginePool) -> None:
    live = engine_pool.get("vllm")
    try:
        suite.case_flush_refused_while_running(live)
    finally:
        engine_pool.stop(engine_pool.key("vllm"))  # the quiet phase's own server: gone before the others boot
