"""One agent session as a pure state machine: arrive -> (gate) -> turn 1 -> tool -> turn 2 ... -> done.

The prompt of turn k is the previous prompt, the ids the *server* returned for turn k-1, and the
plan's new tool ids. Feeding back the server's ids (not re-tokenised text) is what makes a hit
cover exactly the previous prompt and output. No retries and no abandonment: an error ends the
session, and a slow server only delays it.

The context lives in one buffer sized for the session's last prompt, so a turn writes only its
new ids instead of copying the whole context twice (tests/unit/harness/test_client_context.py
checks it against the concatenating form). A prompt handed out is a view of the buffer's first
`len` ids, and those are never written again (ids are only appended after them; a buffer that
must grow is copied into a new one), so a prompt sent earlier stays what it was.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from harness.config import WorkloadConfig
from harness.workload.blockdraw import session_turn_ids
from harness.workload.draws import SessionSpec

_EMPTY = np.empty(0, dtype=np.int32)
_EMPTY.flags.writeable = False


class Phase(enum.Enum):
    PENDING = "pending"  # not yet arrived / not admitted
    WAITING = "waiting"  # request in flight
    TOOL = "tool"  # sleeping in a tool call
    DONE = "done"
    FAILED = "failed"


@dataclass
class TurnOutcome:
    """What the state machine decided after a response: the next tool sleep, or the end."""

    done: bool
    tool_time: float | None = None


class SessionMachine:
    """Walks one frozen SessionSpec. Holds the growing prompt; knows nothing of clocks or sockets."""

    __slots__ = (
        "_buf",
        "_ids",
        "_len",
        "_prev_len",
        "phase",
        "prompt",
        "sid",
        "spec",
        "tool_extra",
        "turn",
        "workload",
    )

    def __init__(self, sid: int, spec: SessionSpec, workload: WorkloadConfig) -> None:
        self.sid = sid
        self.spec = spec
        self.workload = workload
        self.turn = 0  # last turn sent (0 = none yet)
        self.phase = Phase.PENDING
        self.prompt: np.ndarray = _EMPTY
        self.tool_extra = 0.0
        self._prev_len = 0
        self._buf: np.ndarray = _EMPTY  # the context: its first _len ids are the prompt and outputs so far
        self._len = 0
        # every turn's client ids (session_turn_ids: drawn in one block at turn 1, the ids
        # turn_tokens gives turn by turn); dropped when the session ends
        self._ids: list[np.ndarray] = []

    @property
    def n_turns(self) -> int:
        return self.spec.n_turns

    def next_prompt(self) -> np.ndarray:
        """Build and remember the prompt of the next turn; the caller sends it."""
        if self.phase in (Phase.DONE, Phase.FAILED):
            raise RuntimeError(f"session {self.sid} is {self.phase.value}")
        if self.turn >= self.spec.n_turns:
            raise RuntimeError(f"session {self.sid} has no turn after {self.turn}")
        self.turn += 1
        if self.turn == 1:
            self._ids = session_turn_ids(self.workload, self.spec)
        new = self._ids[self.turn - 1]
        if self.turn == 1:
            # room for the last turn's prompt if the server returns decode_tokens ids a turn
            wl = self.workload
            self._buf = np.empty(wl.prompt_len(self.spec.n_turns), dtype=np.int32)
            self._len = 0
        self._append(new)
        self.prompt = self._buf[: self._len]
        self.phase = Phase.WAITING
        return self.prompt

    def _append(self, ids: np.ndarray) -> None:
        """Write `ids` after the context; a full buffer is copied into one twice its size first
        (the views handed out keep the old one)."""
        n = self._len + ids.shape[0]
        if n > self._buf.shape[0]:
            grown = np.empty(max(n, 2 * self._buf.shape[0]), dtype=np.int32)
            grown[: self._len] = self._buf[: self._len]
            self._buf = grown
        self._buf[self._len : n] = ids
        self._len = n

    def on_output(self, output_ids: np.ndarray | None, ok: bool) -> TurnOutcome:
        """Fold the server's output into the context and say what comes next."""
        if self.phase is not Phase.WAITING:
            raise RuntimeError(f"session {self.sid}: response while {self.phase.value}")
        if not ok or output_ids is None:
            self.phase = Phase.FAILED
            self._ids = []
            return TurnOutcome(done=True)
        if self.turn >= self.spec.n_turns:
            self.phase = Phase.DONE
            self.prompt = self._buf = _EMPTY  # free the context
            self._len = 0
            self._ids = []
            return TurnOutcome(done=True)
        self._append(np.asarray(output_ids, dtype=np.int32))
        self.prompt = self._buf[: self._len]
        self.phase = Phase.TOOL
        return TurnOutcome(done=False, tool_time=self.spec.tool_times[self.turn - 1])
