"""The sans-IO contract between load clients and their drivers.

A client (open-loop plan player, closed population, gates) never sleeps, never reads a clock and
never does I/O: it is handed events with the current time and answers with commands. A driver owns
the clock and the transport: the discrete-event simulator feeds it virtual time and the engine
model; the asyncio driver feeds it wall time and HTTP. The same client therefore produces the
same decisions under both clocks, which is what lets a simulated run predict a real one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class Send:
    """Send one turn to the engine now. `request_id` is unique within the run."""

    request_id: int
    session: int  # client-wide session id (plan row)
    turn: int  # 1-based
    prompt: np.ndarray  # int32 token ids: previous prompt + returned ids + new tool ids
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Timer:
    """Call the client's on_timer(key) at time `at` (seconds since run start)."""

    at: float
    key: Hashable


Command = Send | Timer


@dataclass(frozen=True, slots=True)
class TurnResponse:
    """What the driver learned about one Send. Times are seconds since run start.

    `status` is 'ok', 'error' or 'timeout'. On error the token fields may be missing (None) and
    `error` holds the reason; the client records it and ends the session (no retries).
    """

    request_id: int
    status: str
    send_time: float
    done_time: float
    first_token_time: float | None = None
    output_ids: np.ndarray | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int | None = None
    http_status: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # engine-reported fields (ParsedTurn.extra)


class Client(Protocol):
    """Implemented by every load client; driven identically by the simulator and the asyncio driver."""

    def start(self, now: float) -> Sequence[Command]:
        """Begin the run at `now` (normally 0.0)."""

    def on_timer(self, now: float, key: Hashable) -> Sequence[Command]:
        """A Timer the client asked for has fired."""

    def on_response(self, now: float, response: TurnResponse) -> Sequence[Command]:
        """A Send has completed (or failed)."""

    def finished(self) -> bool:
        """True once the client will issue no further commands (the driver may stop)."""
