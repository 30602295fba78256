"""Start an engine on a free port, and again on another one if that port was taken meanwhile.

A port found free (free_port: bind to port 0, read it, close) can be taken by someone else before
the server is started on it: servers booting side by side pick ports of their own for their
processes (SGLang's scheduler and detokenizer, vLLM's engine core), and parallel SLURM jobs on one
node do the same. CI once lost SGLang's 32-token-page server, and both of its fault cases, to
"port already in use". Such a start (EngineStartError reason 'port_in_use') is tried again on a new
free port, up to `tries` starts; any other failed start is final, and so is a port the caller
chose (a user's --port is theirs: another one would not be what they asked for).

One helper for the run, the smoke command and the test session's server pool, so all three start
engines the same way; `on_launch` lets the run record each command line (meta.json
engine_launch) before its start, so what is on record is the start that came up.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from harness.config import CellConfig
from harness.servers.base import EngineAdapter, EngineStartError, ServerHandle, free_port

log = logging.getLogger("agentload.servers")

PORT_TRIES = 3  # starts of a server whose port was taken between finding it free and starting on it


def start_on_free_port(
    adapter: EngineAdapter,
    cell: CellConfig,
    run_dir: Path,
    *,
    model: str,
    host: str,
    health_timeout: float,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    tries: int = PORT_TRIES,
    pick_port: Callable[[], int] | None = None,
    on_launch: Callable[[list[str], dict[str, str], int], None] | None = None,
) -> tuple[ServerHandle, list[str]]:
    """(handle, argv) of the start that came up (its port is in handle.base_url). `env` is added to the engine's own
    environment; `pick_port` finds a free port (default free_port on `host`)."""
    if tries < 1:
        raise ValueError(f"tries must be >= 1, got {tries}")
    pick = pick_port or (lambda: free_port(host))
    for attempt in range(1, tries + 1):
        chosen = port if port is not None else pick()
        argv, launch_env = adapter.launch_command(cell, model=model, host=host, port=chosen, extra_args=extra_args)
        launch_env.update(env or {})
        if on_launch is not None:
            on_launch(argv, launch_env, chosen)
        try:
            handle = adapter.start(argv, launch_env, run_dir, host=host, port=chosen, health_timeout=health_timeout)
        except EngineStartError as exc:
            if exc.reason != "port_in_use" or port is not None or attempt == tries:
                raise
            log.warning("%s (start %d of %d): starting on another port", exc, attempt, tries)
            continue
        return handle, argv
    raise AssertionError("unreachable: the last try returns or raises")
