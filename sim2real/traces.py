"""Random operation traces for the differential tests: multi-turn sessions, flushes, pool pressure.

A trace is the *input* both engines see, fixed before either runs: sessions (arrival step, turn
count, first prompt, the new tool ids of every follow-up, the max_tokens and the think steps of
every turn) and flush attempts. The follow-up prompt of a session is its previous prompt, the ids
the engine returned and the new tool ids, exactly as the agentload client builds it; only *when*
a follow-up is sent depends on a run (think steps after the previous turn finished), and the
differential runner takes that time from the real engine, so both engines receive identical
requests at identical steps.

Options that exercise the engines' corner cases, on top of the workload's private multi-turn
prefixes:
- `shared_prefix`: a fraction of sessions start with one common prefix (concurrent hits on blocks
  or nodes that a running request holds);
- `repeat`: a follow-up may resend the previous prompt unchanged (a fully cached prompt, which
  must still compute its last token);
- a small pool and many concurrent sessions (eviction, admission blocking, preemption);
- long prompts against a small token budget (chunked prefill).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

VOCAB_LOW, VOCAB_HIGH = 4, 32000


@dataclass(frozen=True)
class EngineShape:
    """The engine settings both sides are built with (vLLM names; SGLang maps them)."""

    num_blocks: int = 256  # KV pool, in blocks (vLLM: --num-gpu-blocks-override); tokens = blocks x block
    block_size: int = 16  # vLLM block / SGLang page size
    max_num_seqs: int = 16  # running-request limit
    max_num_batched_tokens: int = 512  # token budget of one step (chunked-prefill size)
    max_model_len: int = 2048

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class TraceSpec:
    """How to draw one random trace. Ranges are inclusive (low, high)."""

    name: str
    seed: int = 0
    sessions: int = 12
    arrival_span: int = 40  # sessions arrive uniformly over the first `arrival_span` steps
    turns: tuple[int, int] = (1, 6)
    first_prompt: tuple[int, int] = (40, 300)
    tool_tokens: tuple[int, int] = (10, 120)
    max_tokens: tuple[int, int] = (2, 24)
    think: tuple[int, int] = (0, 6)  # steps between a turn's completion and the follow-up's arrival
    shared_prefix: int = 0  # tokens of a common prefix ...
    shared_fraction: float = 0.0  # ... that this fraction of sessions starts with
    repeat: float = 0.0  # probability that a follow-up resends the previous prompt unchanged
    flush_every: int = 0  # attempt a cache flush every this many steps (0: never)
    max_steps: int = 4000
    prefix_caching: bool = True
    schedule_policy: str = "fcfs"  # "lpm": SGLang only (vLLM schedules FCFS)
    engine: EngineShape = field(default_factory=EngineShape)

    def with_seed(self, seed: int) -> TraceSpec:
        return replace(self, seed=seed)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SessionTrace:
    index: int
    arrival: int
    first_prompt: tuple[int, ...]
    tools: tuple[tuple[int, ...], ...]  # new ids of follow-ups 2..T (empty tuple = a repeat)
    repeats: tuple[bool, ...]  # follow-up k+2 resends the previous prompt unchanged
    max_tokens: tuple[int, ...]  # per turn
    think: tuple[int, ...]  # per follow-up

    @property
    def n_turns(self) -> int:
        return len(self.max_tokens)


@dataclass(frozen=True)
class Trace:
    spec: TraceSpec
    sessions: tuple[SessionTrace, ...]
    flush_steps: tuple[int, ...]


def _ids(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in rng.integers(VOCAB_LOW, VOCAB_HIGH, size=n))


def _draw(rng: np.random.Generator, lo_hi: tuple[int, int]) -> int:
    lo, hi = lo_hi
    if lo > hi:
        raise ValueError(f"range {lo_hi}: low above high")
    return int(rng.integers(lo, hi + 1))


def make_trace(spec: TraceSpec) -> Trace:
    """Draw the trace of `spec` (a pure function of the spec, seed included).

    Every request of every session fits the engine's context: prompts are cut so that the final
    turn's prompt plus its max_tokens stays within max_model_len, and the pool (a request that can
    never fit the pool would wait forever on vLLM and be refused by SGLang).
    """
    rng = np.random.default_rng([spec.seed, 0x5132])
    e = spec.engine
    limit = min(e.max_model_len, e.pool_tokens - e.block_size)
    shared = _ids(rng, spec.shared_prefix) if spec.shared_prefix else ()
    sessions = []
    for i in range(spec.sessions):
        arrival = int(rng.integers(0, max(1, spec.arrival_span)))
        n_turns = _draw(rng, spec.turns)
        first = _ids(rng, _draw(rng, spec.first_prompt))
        if shared and rng.random() < spec.shared_fraction:
            first = shared + first
        mt = [_draw(rng, spec.max_tokens) for _ in range(n_turns)]
        first = first[: max(1, limit - mt[0])]
        tools, reps, think = [], [], []
        length = len(first)
        turns_kept = 1
        for k in range(1, n_turns):
            rep = bool(rng.random() < spec.repeat)
            new = () if rep else _ids(rng, _draw(rng, spec.tool_tokens))
            nxt = length if rep else length + mt[k - 1] + len(new)
            if nxt + mt[k] > limit:
                break
            tools.append(new)
            reps.append(rep)
            think.append(_draw(rng, spec.think))
            length = nxt
            turns_kept += 1
        sessions.append(
            SessionTrace(i, arrival, first, tuple(tools), tuple(reps), tuple(mt[:turns_kept]), tuple(think))
        )
    flushes = tuple(range(spec.flush_every, spec.max_steps, spec.flush_every)) if spec.flush_every else ()
    return Trace(spec, tuple(sessions), flushes)


# The default suite: each entry names the engine behaviour it stresses. Sizes are small so that
# one engine's whole suite runs in well under two minutes on a shared 2-core machine.
def default_suite(seeds: int = 3) -> list[TraceSpec]:
    base = [
        TraceSpec("warm", sessions=10, engine=EngineShape(num_blocks=512)),
        TraceSpec(
            "pressure",
            sessions=24,
            arrival_span=20,
            first_prompt=(60, 400),
            max_tokens=(4, 40),
            engine=EngineShape(num_blocks=96, max_num_seqs=12),
        ),
        TraceSpec(
            "chunked",
            sessions=8,
            first_prompt=(300, 900),
            tool_tokens=(50, 300),
            engine=EngineShape(num_blocks=400, max_num_batched_tokens=256, max_model_len=3072),
        ),
        TraceSpec(
            "flush", sessions=10, arrival_span=120, think=(0, 30), flush_every=25, engine=EngineShape(num_blocks=256)
        ),
        TraceSpec(
            "shared",
            sessions=14,
            shared_prefix=96,
            shared_fraction=0.6,
            repeat=0.25,
            engine=EngineShape(num_blocks=160),
        ),
        # the agentload workload scaled to the CPU cell (L0 512, Delta 128, d 16, block 32), with
        # a pool that holds about a dozen sessions: hits, then eviction under load
        TraceSpec(
            "workload",
            sessions=20,
            arrival_span=60,
            turns=(2, 8),
            first_prompt=(512, 512),
            tool_tokens=(128, 128),
            max_tokens=(16, 16),
            think=(0, 12),
            engine=EngineShape(
                num_blocks=160, block_size=32, max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=2048
            ),
        ),
        TraceSpec(
            "seqlimit",
            sessions=20,
            arrival_span=10,
            max_tokens=(8, 48),
            engine=EngineShape(num_blocks=400, max_num_seqs=4),
        ),
        TraceSpec("nocache", sessions=16, arrival_span=20, prefix_caching=False, engine=EngineShape(num_blocks=96)),
        # SGLang's LPM: the queue sorted by cached prefix while few wait, FCFS past the fallback
        TraceSpec(
            "lpm",
            sessions=24,
            arrival_span=15,
            first_prompt=(60, 400),
            max_tokens=(4, 40),
            think=(0, 3),
            schedule_policy="lpm",
            engine=EngineShape(num_blocks=120, max_num_seqs=12),
        ),
        # cache off with chunked prompts (E0a's regime: SGLang's ignore_eos admission, chunk budgets)
        TraceSpec(
            "nocache-chunked",
            sessions=24,
            arrival_span=10,
            turns=(2, 6),
            first_prompt=(200, 900),
            tool_tokens=(100, 300),
            max_tokens=(16, 40),
            prefix_caching=False,
            engine=EngineShape(num_blocks=250, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=3072),
        ),
    ]
    return [s.with_seed(k) for s in base for k in range(seeds)]
