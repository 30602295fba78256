"""One agent session as a pure state machine: arrive -> (gate) -> turn 1 -> tool -> turn 2 ... -> done.

The prompt of turn k is the previous prompt, the ids the *server* returned for turn k-1, and the
plan's new tool ids. Feeding back the server's ids (not re-tokenised text) is what makes a hit
cover exactly the previous prompt and output. No retries and no abandonment: an error ends the
session, and a slow server only delays it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from harness.config import WorkloadConfig
from harness.workload.draws import SessionSpec, turn_tokens


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

    __slots__ = ("_prev_len", "phase", "prompt", "sid", "spec", "tool_extra", "turn", "workload")

    def __init__(self, sid: int, spec: SessionSpec, workload: WorkloadConfig) -> None:
        self.sid = sid
        self.spec = spec
        self.workload = workload
        self.turn = 0  # last turn sent (0 = none yet)
        self.phase = Phase.PENDING
        self.prompt: np.ndarray = np.empty(0, dtype=np.int32)
        self.tool_extra = 0.0
        self._prev_len = 0

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
        new = turn_tokens(self.workload, self.spec, self.turn)
        self.prompt = new if self.turn == 1 else np.concatenate((self.prompt, new))
        self.phase = Phase.WAITING
        return self.prompt

    def on_output(self, output_ids: np.ndarray | None, ok: bool) -> TurnOutcome:
        """Fold the server's output into the context and say what comes next."""
        if self.phase is not Phase.WAITING:
            raise RuntimeError(f"session {self.sid}: response while {self.phase.value}")
        if not ok or output_ids is None:
            self.phase = Phase.FAILED
            return TurnOutcome(done=True)
        if self.turn >= self.spec.n_turns:
            self.phase = Phase.DONE
            self.prompt = np.empty(0, dtype=np.int32)  # free the context
            return TurnOutcome(done=True)
        self.prompt = np.concatenate((self.prompt, np.asarray(output_ids, dtype=np.int32)))
        self.phase = Phase.TOOL
        return TurnOutcome(done=False, tool_time=self.spec.tool_times[self.turn - 1])
