"""The emulator's engine side: the reference engine model stepped on a (scaled) real-time clock,
its injected faults and its counters. harness/emulator/server.py puts it behind HTTP; the module
docstring there says why the emulator exists and what each fault and gauge does.

One background task runs iterations (step, sleep until the iteration's end, complete, wake the
waiting handlers); the engine clock may lead the wall clock by at most `_MAX_LEAD` wall seconds,
and lag it by at most `_CATCH_UP` (20 ms): a wake-up that late (a sleep overshoots, a loaded host) starts the
next iteration where the last one ended, so the model's iterations keep their own times instead of
each adding the loop's lateness (which made a decode step read 10-20% long to a client).

Streaming: a request submitted with `on_tokens` is told, at the end of every iteration that gave it
tokens, how many it has and which, so an SSE handler sends each token when the model produced it and
a client measures the model's own first-token time and decode steps. While such a request is in
flight the engine is stepped one iteration at a time (no fused decode runs, whose inner step ends
the model does not hand out); fusing changes no decision and no time (the fast-path equivalence
tests), so the model's schedule is the same either way, only finer grained.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry

from harness.config import CellConfig
from harness.emulator import flavors
from harness.refengine.model import EngineCompletion, EngineModel, EngineRequest

log = logging.getLogger("agentload.emulator")

_MAX_LEAD = 0.001  # wall seconds the engine clock may run ahead of the wall clock
_CATCH_UP = 0.02  # wall seconds a late wake-up may be absorbed by starting at the last end (no drift)
ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
_FAULT_KINDS = ("die-after", "5xx", "malformed", "no-usage", "hang", "unhealthy")
VERSION = {"sglang": "0.5.22-emulated", "vllm": "0.32.0-emulated"}
HEALTH_POLL = {"sglang": 1.0, "vllm": 0.0}  # wall seconds a /health answer takes
WARMUP = {"sglang": 0.5, "vllm": 0.0}  # wall seconds of 503 after the engine starts
SGLANG_DECODE_LOG_INTERVAL = 40  # decode steps between two gauge reports (--decode-log-interval)
SGLANG_IDLE_REPORT = 30.0  # wall seconds between two gauge reports of an idle scheduler
SGLANG_SCHEDULER_GAUGES = ("running", "waiting", "kv_used_tokens", "kv_evictable_tokens")
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
FLUSH_REFUSED = "Flush cache failed.\n"  # busy and no ?timeout (or ?timeout=0)
FLUSH_TIMED_OUT = "Timed out waiting for idle state."  # busy for all of ?timeout=S
FLUSH_IN_PROGRESS = "Another flush_cache is already in progress."


@dataclass(frozen=True)
class Faults:
    """Test-only failure modes; all off by default."""

    die_after: int | None = None
    every_5xx: int | None = None
    every_malformed: int | None = None
    every_no_usage: int | None = None
    every_hang: int | None = None
    unhealthy: bool = False

    @classmethod
    def parse(cls, specs: list[str] | tuple[str, ...] | None) -> Faults:
        """Parse `KIND[:N]` strings (see the module docstring)."""
        kw: dict[str, Any] = {}
        names = {
            "die-after": "die_after",
            "5xx": "every_5xx",
            "malformed": "every_malformed",
            "no-usage": "every_no_usage",
            "hang": "every_hang",
        }
        for spec in specs or ():
            kind, _, arg = spec.partition(":")
            if kind == "unhealthy":
                kw["unhealthy"] = True
                continue
            if kind not in names:
                raise ValueError(f"unknown fault {spec!r}; expected one of {', '.join(_FAULT_KINDS)}")
            try:
                n = int(arg)
            except ValueError:
                raise ValueError(f"fault {spec!r}: expected {kind}:N with a positive integer N") from None
            if n < 1:
                raise ValueError(f"fault {spec!r}: N must be >= 1")
            kw[names[kind]] = n
        return cls(**kw)

    def hits(self, every: int | None, n: int) -> bool:
        return every is not None and n % every == 0


class Reply(Exception):
    """A ready HTTP error for the client (bad request, context overflow)."""

    def __init__(self, response: web.Response) -> None:
        super().__init__()
        self.response = response


#: told (tokens so far, the request's output ids) after each iteration that gave a streamed request tokens
TokenSink = Callable[[int, np.ndarray], None]


@dataclass
class _Waiter:
    future: asyncio.Future[EngineCompletion]
    submit_wall: float
    on_tokens: TokenSink | None = None
    sent: int = 0  # tokens already told to on_tokens


def generated(model: Any, req_id: int) -> tuple[int, np.ndarray | None]:
    """Tokens a running request has produced so far and its output ids ((0, None) while it waits or
    once it left). The engine model counts a decoding request's tokens from its global decode-step
    counter (harness/refengine/base.py: gen + dstep - join during a decode stint), so this is O(1)."""
    req = model.running.get(req_id)
    if req is None:
        return 0, None
    n = req.gen + (model.dstep - req.join) if req.state == "decode" else req.gen
    return int(n), req.out


@dataclass
class EmulatorStats:
    requests: int = 0
    completed: int = 0
    rejected: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    # SGLang's tokenizer-side counters, by is_streaming ("true"/"false"), counted when a request
    # finishes (as the tokenizer manager does); cached tokens have no streaming label.
    tokenizer: dict[str, dict[str, int]] = field(default_factory=dict)
    tokenizer_cached: int = 0

    def count_finished(self, streaming: bool, prompt: int, generated: int, cached: int) -> None:
        c = self.tokenizer.setdefault(
            "true" if streaming else "false", {"prompt_tokens": 0, "generation_tokens": 0, "num_requests": 0}
        )
        c["prompt_tokens"] += prompt
        c["generation_tokens"] += generated
        c["num_requests"] += 1
        self.tokenizer_cached += cached


class Emulator:
    """One emulated engine: the model, its clock, and the requests waiting on it."""

    def __init__(
        self,
        cell: CellConfig,
        *,
        flavor: str | None = None,
        time_scale: float = 1.0,
        model_name: str = "emulated",
        seed: int = 0,
        faults: Faults | None = None,
        die: Callable[[], None] | None = None,
        health_poll: float | None = None,
        warmup: float | None = None,
    ) -> None:
        flavor = flavor or cell.engine.name
        if flavor not in flavors.FLAVORS:
            raise ValueError(f"flavor {flavor!r}; expected one of {flavors.FLAVORS}")
        if time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {time_scale}")
        self.cell = cell
        self.flavor = flavor
        self.time_scale = float(time_scale)
        self.model_name = model_name
        self.model = EngineModel(cell, seed=seed)
        self.faults = faults or Faults()
        self.die: Callable[[], None] = die or (lambda: os._exit(17))
        self.stats = EmulatorStats()
        self._waiters: dict[int, _Waiter] = {}
        self._last_submit = 0.0  # engine time of the latest request (an iteration never starts before it)
        self._streams: set[int] = set()  # requests streamed token by token (submit's on_tokens)
        self._next_id = 0
        self._t0 = time.monotonic()
        self._floor = 0.0  # latest engine time handed to the model; the model's clock never goes back
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._dead: str | None = None
        self.health_poll = HEALTH_POLL[flavor] if health_poll is None else float(health_poll)
        self.warmup = WARMUP[flavor] if warmup is None else float(warmup)
        self._up_at = 0.0
        self.flush_pending = False
        # the latest prefill batch (SGLang's cache_hit_rate and num_retracted_reqs report on it)
        self._seen = {"prompt": 0, "cached": 0, "preemptions": 0}
        self._hit_rate = 0.0
        self._retracted_report = 0
        self._published: dict[str, float] = {}
        self._published_at = 0.0
        self._decode_steps = 0
        self._publish()
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(flavors.EngineCollector(flavor, model_name, cell, self.snapshot))

    def snapshot(self) -> dict[str, Any]:
        """The model's gauges plus what the server itself counts (SGLang's tokenizer counters,
        the latest prefill batch's hit rate and retractions)."""
        g: dict[str, Any] = self.model.gauges()
        if self.flavor == "sglang":
            if not self.model.has_work() and time.monotonic() - self._published_at >= SGLANG_IDLE_REPORT:
                self._publish()  # the idle scheduler's periodic report (it polls; here it is lazy)
            g.update(self._published)
            g["cache_hit_rate"] = self._hit_rate
            g["retracted_report"] = float(self._retracted_report)
            g["pid"] = os.getpid()
            g["tokenizer"] = {k: dict(v) for k, v in self.stats.tokenizer.items()}
            g["tokenizer_cached"] = self.stats.tokenizer_cached
        return g

    def _publish(self) -> None:
        g = self.model.gauges()
        self._published = {k: float(g[k]) for k in SGLANG_SCHEDULER_GAUGES}
        self._published_at = time.monotonic()

    def _note_iteration(self, kind: str, steps: int) -> None:
        """After an iteration completed: SGLang reports its gauges after a prefill batch and
        every SGLANG_DECODE_LOG_INTERVAL decode steps."""
        before = self._decode_steps
        if kind != "prefill":
            self._decode_steps += steps
        crossed = self._decode_steps // SGLANG_DECODE_LOG_INTERVAL > before // SGLANG_DECODE_LOG_INTERVAL
        if kind in ("prefill", "mixed") or crossed:
            self._publish()

    def _note_batch(self) -> None:
        """After a step: if it admitted requests, it is the latest prefill batch."""
        c = self.model.counters
        if c["prompt"] == self._seen["prompt"]:
            return
        d_prompt = c["prompt"] - self._seen["prompt"]
        self._hit_rate = (c["cached"] - self._seen["cached"]) / d_prompt if d_prompt > 0 else 0.0
        self._retracted_report = c["preemptions"] - self._seen["preemptions"]
        self._seen = {k: c[k] for k in self._seen}

    def healthy_now(self) -> bool:
        return time.monotonic() >= self._up_at

    # ------------------------------------------------------------------ clock
    def engine_now(self) -> float:
        """Engine time: wall seconds since start times the time scale, never behind the model."""
        return max((time.monotonic() - self._t0) * self.time_scale, self._floor)

    # ------------------------------------------------------------------ engine loop
    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._t0 = time.monotonic()
        self._up_at = self._t0 + self.warmup
        self._task = asyncio.create_task(self._run(), name="emulator-engine")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for w in self._waiters.values():
            if not w.future.done():
                w.future.cancel()

    async def _run(self) -> None:
        assert self._wake is not None
        m = self.model
        try:
            after: float | None = None  # the end of the iteration just applied (None after idling)
            while True:
                now = self.engine_now()
                if after is not None and now - after <= _CATCH_UP * self.time_scale:
                    # the loop woke a little late: the next iteration starts where the last ended
                    # (after any request that arrived since), so the model's schedule does not drift
                    now = max(after, self._last_submit)
                # Decode-only iterations that start within the lead bound may be fused: a request
                # arriving meanwhile waits at most _MAX_LEAD wall seconds longer than it would.
                # a streamed request in flight: one iteration at a time, each token at its own end
                end = m.step(now, now if self._streams else now + _MAX_LEAD * self.time_scale)
                self._floor = now
                iteration = m.iteration
                if self.flavor == "sglang":
                    self._note_batch()
                if end is None:  # idle: sleep until a request arrives
                    if self.flavor == "sglang" and self._published.get("running", 0.0) != 0.0:
                        self._publish()  # falling idle with a stale running count
                    self._wake.clear()
                    await self._wake.wait()
                    after = None
                    continue
                lead = (end - (time.monotonic() - self._t0) * self.time_scale) / self.time_scale
                await asyncio.sleep(lead if lead > _MAX_LEAD else 0)
                self._floor = max(self._floor, end)
                done = m.complete(end)
                after = end
                if self.flavor == "sglang" and iteration is not None:
                    self._note_iteration(*iteration)
                if self._streams:
                    self._tell_tokens()
                self._resolve(done)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a model bug: fail every waiter loudly, keep serving health as dead
            log.exception("engine model failed")
            self._dead = f"engine model failed: {exc!r}"
            for w in self._waiters.values():
                if not w.future.done():
                    w.future.set_exception(RuntimeError(self._dead))

    def _tell_tokens(self) -> None:
        """Each streamed request that got tokens in the iteration just applied is told of them."""
        for rid in list(self._streams):
            w = self._waiters.get(rid)
            if w is None or w.on_tokens is None:
                self._streams.discard(rid)
                continue
            n, out = generated(self.model, rid)
            if n > w.sent and out is not None:
                w.sent = n
                w.on_tokens(n, out)

    def _resolve(self, done: list[Any]) -> None:
        for c in done:
            self._streams.discard(c.req_id)
            w = self._waiters.pop(c.req_id, None)
            if w is not None and not w.future.done():
                w.future.set_result(c)
                self.stats.completed += 1

    async def submit(self, prompt: np.ndarray, max_tokens: int, on_tokens: TokenSink | None = None) -> EngineCompletion:
        """Queue one request on the engine and wait for its completion; `on_tokens` (a streamed
        request) is told of its tokens as iterations produce them (the last ones may come only
        with the completion: the iteration that finishes a request removes it from the batch)."""
        if self._dead:
            raise RuntimeError(self._dead)
        req_id = self._next_id
        self._next_id += 1
        fut: asyncio.Future[EngineCompletion] = asyncio.get_running_loop().create_future()
        self._last_submit = self.engine_now()
        self.model.submit(EngineRequest(req_id=req_id, prompt=prompt, max_tokens=max_tokens), self._last_submit)
        self._waiters[req_id] = _Waiter(fut, time.monotonic(), on_tokens)
        if on_tokens is not None:
            self._streams.add(req_id)
        assert self._wake is not None
        self._wake.set()
        try:
            return await fut
        finally:
            self._streams.discard(req_id)

    def wall_of(self, engine_time: float) -> float:
        """The monotonic wall time at which the engine clock read `engine_time`."""
        return self._t0 + engine_time / self.time_scale

    def try_flush(self) -> bool:
        return bool(self.model.flush_cache())

    # ------------------------------------------------------------------ request parsing
    def bad_request(
        self, message: str, status: int = 400, kind: str = "BadRequestError", param: str | None = None
    ) -> Reply:
        self.stats.rejected += 1
        return Reply(
            web.Response(
                status=status,
                body=orjson.dumps(flavors.error_body(self.flavor, message, status, kind, param)),
                content_type="application/json",
            )
        )

    def parse_prompt(self, raw: Any) -> np.ndarray:
        """Token ids as sent, or a text prompt split into test-vocabulary words (`w<id>`)."""
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (list, str)):
            raw = raw[0]  # a batch of one
        if isinstance(raw, str):
            return _words_to_ids(raw)
        if isinstance(raw, list) and (not raw or isinstance(raw[0], int)):
            try:
                return np.asarray(raw, dtype=np.int64).astype(np.int32)
            except (TypeError, ValueError, OverflowError):
                raise self.bad_request("prompt must be a list of token ids") from None
        raise self.bad_request("prompt must be a string or a list of token ids (batches are not supported)")

    def check_fits(self, prompt: np.ndarray, max_tokens: int) -> int:
        """Refuse what the engine refuses; returns the max_tokens it will serve (vLLM cuts it)."""
        n = int(prompt.shape[0])
        if n == 0:
            raise self.bad_request("The prompt is empty.")
        ctx = self.cell.context_length
        refused = flavors.refusal(self.flavor, n, max_tokens, ctx, self.cell.kv_pool_tokens)
        if refused is not None:
            raise self.bad_request(refused[0], param=refused[1])
        return flavors.served_max_tokens(self.flavor, n, max_tokens, ctx)

    def fault_for(self, n: int) -> str | None:
        f = self.faults
        if f.die_after is not None and n >= f.die_after:
            return "die"
        for name, every in (
            ("hang", f.every_hang),
            ("5xx", f.every_5xx),
            ("malformed", f.every_malformed),
            ("no-usage", f.every_no_usage),
        ):
            if f.hits(every, n):
                self.stats.faults[name] = self.stats.faults.get(name, 0) + 1
                return name
        return None


def _words_to_ids(text: str) -> np.ndarray:
    ids = []
    for w in text.split():
        m = re.fullmatch(r"w(\d+)", w)
        ids.append(int(m.group(1)) if m else 4 + (hash(w) % 31996))
    return np.asarray(ids, dtype=np.int32)
