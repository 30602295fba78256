"""The one HTTP session policy for talking to an engine's server.

Why it exists: the engines' HTTP servers (uvicorn under vLLM and SGLang) close a connection left
idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, SGLANG_TIMEOUT_KEEP_ALIVE), while aiohttp keeps an idle
connection for 15 s by default and hands out the *oldest* idle one first. A connection idle for
about 5 s is then picked for the next request just as the server closes it, and that request fails
with ServerDisconnectedError (seen on a flush sent 5 s after the previous request had ended). A
client that closes its idle connections well before the server's timer (KEEPALIVE_S) never picks
a half-closed one: aiohttp measures the idle time when it picks, so a client that was itself held
up for seconds still drops the stale connection rather than reusing it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

#: Seconds an idle connection is kept for reuse: below the engines' 5 s keep-alive timeout.
KEEPALIVE_S = 2.0


def engine_session(**session_kwargs: Any) -> aiohttp.ClientSession:
    """An aiohttp session for an engine's server: no connection cap (an open-loop client must never
    queue a turn behind another on its own side) and idle connections closed after KEEPALIVE_S.
    `session_kwargs` go to aiohttp.ClientSession (timeouts, headers)."""
    import aiohttp  # deferred: the simulator's commands never load aiohttp

    connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True, keepalive_timeout=KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, **session_kwargs)
