"""The real-time driver: plays any sans-IO Client against an HTTP engine on one asyncio loop.

It does for wall time what harness/drivers/virtual.py does for virtual time, and nothing more: Timers become
`loop.call_at` handles on the loop's monotonic clock, Sends become aiohttp POSTs built and parsed by
the engine adapter, and every outcome (a reply, an HTTP error, a malformed body, a timeout, a
dropped connection) goes back to the client as a TurnResponse, so the client's records are the
run's records whatever the server does. The loop itself must never die of a bad response: a
registered run that crashed on turn 40,000 would be lost, one that recorded the error is not.

Clocks. Plan time = wall seconds since the start x `time_scale` (the emulator may compress its
engine clock by the same factor so a long protocol fits in a test; a real engine s times faster
than the one a registration was calibrated on is played at s, runs/host_scale.py). Every time
handed to the client or written to a record is plan time.

Open loop. A Timer fires on the plan's clock whatever the server is doing; the delay between a
timer's due time and the moment it ran ("lateness") is recorded per timer kind, because a client
that cannot keep up would silently turn an open-loop experiment into a closed one. The benchmark
(benchmarks/bench_client.py) reads the session-start lateness from DriveResult.

Ending. The run ends COMPLETED when the client is finished or the plan horizon (`duration`) is
reached, INTERRUPTED on SIGTERM/SIGINT or `stop_event`, FAILED when the server is gone (connection
refused, the process exited, /health no longer answers or answers 5xx after a failed turn) or the
client raised. In every case requests still in flight are abandoned (not fed back),
`client.close(now)` is called when the client has it (the plan client then records them as open),
and the recorder is flushed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import signal
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from harness.client.contract import Client, Send, Timer, TurnResponse
from harness.drivers.drive_result import DriveResult, reason_class, timer_tag
from harness.drivers.sinks import DriveProgress, DriveRecorder, write_gauge
from harness.recording.schema import RunStatus
from harness.servers.base import ParsedTurn, ResponseError
from harness.servers.keepalive import engine_session

if TYPE_CHECKING:
    import aiohttp

HEALTH_TRIES = 3  # after a dropped connection, /health is asked this many times before the server counts as gone
HEALTH_GAP_S = 1.0
ENGINE_TIMINGS = ("queue_time", "engine_ttft", "engine_decode")  # ParsedTurn.extra keys, seconds

log = logging.getLogger("agentload.driver")

_JSON_HEADERS = {"Content-Type": "application/json"}


def _connection_errors() -> tuple[type[BaseException], ...]:
    """What a dropped connection raises. aiohttp is imported here, not at the top: the simulator's
    commands import this module (runs.realrun) and never drive HTTP (~0.1 s of `test run`)."""
    import aiohttp

    return (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError, OSError)


class Transport(Protocol):
    """What the driver needs from an engine adapter (EngineAdapter satisfies it)."""

    def completion_request(self, prompt: np.ndarray, max_tokens: int, model_name: str) -> tuple[str, bytes]: ...

    def parse_completion(self, http_status: int, body: bytes) -> ParsedTurn: ...

    async def scrape_metrics(self, http: aiohttp.ClientSession, base_url: str) -> dict[str, float]: ...


class _Driver:
    def __init__(
        self,
        client: Client,
        transport: Transport,
        base_url: str,
        *,
        model_name: str,
        time_scale: float,
        request_timeout: float,
        recorder: DriveRecorder | None,
        gauge_interval: float | None,
        duration: float | None,
        server_alive: Callable[[], str | None] | None,
        progress: DriveProgress | None,
        session: aiohttp.ClientSession,
    ) -> None:
        self.client = client
        self.transport = transport
        self.base_url = base_url.rstrip("/")
        self.model_name = model_name
        self.scale = float(time_scale)
        self.request_timeout = request_timeout
        self.recorder = recorder
        self.gauge_interval = gauge_interval
        self.duration = duration
        self.server_alive = server_alive
        self.progress = progress
        self.http = session
        self.connection_errors = _connection_errors()
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.timers: dict[int, asyncio.TimerHandle] = {}
        self._timer_seq = 0
        self.inflight: dict[int, asyncio.Task[None]] = {}
        self.lateness: dict[str, list[float]] = collections.defaultdict(list)
        self.done = asyncio.Event()
        self.status: RunStatus | None = None
        self.reason = ""
        self.counts: collections.Counter[str] = collections.Counter()  # sent / ok / error / timeout
        self.error_reasons: collections.Counter[str] = collections.Counter()
        self.gauge_scrapes = 0
        self.gauge_failures = 0
        self._probing = False

    # ------------------------------------------------------------------ clock
    def plan_now(self) -> float:
        return (self.loop.time() - self.t0) * self.scale

    def wall_at(self, plan_t: float) -> float:
        return self.t0 + plan_t / self.scale

    # ------------------------------------------------------------------ ending
    def finish(self, status: RunStatus, reason: str) -> None:
        """First caller wins: a signal during a failure does not relabel the failure."""
        if self.status is None:
            self.status, self.reason = status, reason
            log.info("drive ending: %s (%s) at plan time %.1f s", status, reason, self.plan_now())
        self.done.set()

    def _check_finished(self) -> None:
        # While a dropped connection is being looked into, the client may have ended its last
        # session on that very error: wait for the probe, which says whether the server died.
        if self.status is None and self.client.finished() and not self._probing:
            self.finish(RunStatus.COMPLETED, "client finished")

    # ------------------------------------------------------------------ commands
    def dispatch(self, cmds: Sequence[Any]) -> None:
        for c in cmds:
            if isinstance(c, Send):
                self._send(c)
            elif isinstance(c, Timer):
                self._schedule(c)
            else:
                raise TypeError(f"client issued an unknown command {c!r}")

    def _schedule(self, timer: Timer) -> None:
        if self.duration is not None and timer.at >= self.duration:
            return  # beyond the horizon: it would never fire in this run
        seq = self._timer_seq
        self._timer_seq += 1
        when = self.wall_at(timer.at)
        self.timers[seq] = self.loop.call_at(when, self._fire, seq, timer, when)

    def _fire(self, seq: int, timer: Timer, when: float) -> None:
        self.timers.pop(seq, None)
        if self.status is not None:
            return
        fired = self.loop.time()
        self.lateness[timer_tag(timer.key)].append(max(fired - when, 0.0))
        try:
            self.dispatch(self.client.on_timer(self.plan_now(), timer.key))
        except Exception as exc:  # a client bug: end the run with the reason, keep the records
            log.exception("client failed in on_timer")
            self.finish(RunStatus.FAILED, f"client error in on_timer: {exc!r}")
            return
        self._check_finished()

    def _send(self, send: Send) -> None:
        if self.status is not None:
            return
        self.counts["sent"] += 1
        task = self.loop.create_task(self._request(send))
        self.inflight[send.request_id] = task

    # ------------------------------------------------------------------ one request
    async def _request(self, send: Send) -> None:
        path, body = self.transport.completion_request(send.prompt, send.max_tokens, self.model_name)
        url = self.base_url + path
        t_send = self.plan_now()
        t_first: float | None = None
        http_status: int | None = None
        conn_error = False
        try:
            async with asyncio.timeout(self.request_timeout):
                async with self.http.post(url, data=body, headers=_JSON_HEADERS) as resp:
                    t_first = self.plan_now()  # response headers: the first byte of the reply
                    http_status = resp.status
                    raw = await resp.read()
            t_done = self.plan_now()
            parsed = self.transport.parse_completion(http_status, raw)
            tr = TurnResponse(
                request_id=send.request_id,
                status="ok",
                send_time=t_send,
                done_time=t_done,
                first_token_time=t_first,
                output_ids=parsed.output_ids,
                prompt_tokens=parsed.prompt_tokens,
                cached_tokens=parsed.cached_tokens,
                completion_tokens=parsed.completion_tokens,
                http_status=http_status,
                extra=self._plan_timings(dict(getattr(parsed, "extra", {}) or {})),
            )
        except ResponseError as exc:
            tr = self._failed(
                send,
                "error",
                t_send,
                t_first,
                exc.reason,
                exc.http_status if exc.http_status is not None else http_status,
            )
        except TimeoutError:
            tr = self._failed(
                send, "timeout", t_send, t_first, f"no complete response within {self.request_timeout:g} s", http_status
            )
        except asyncio.CancelledError:
            raise  # abandoned at the end of the drive
        except self.connection_errors as exc:
            conn_error = True
            tr = self._failed(
                send, "error", t_send, t_first, f"connection: {type(exc).__name__}: {exc}".strip(), http_status
            )
        except Exception as exc:  # anything else about one reply must not end the run
            log.exception("unexpected error on request %d", send.request_id)
            tr = self._failed(send, "error", t_send, t_first, f"client-side: {type(exc).__name__}: {exc}", http_status)
        self.inflight.pop(send.request_id, None)
        if self.status is not None:
            return
        self.counts["ok" if tr.status == "ok" else tr.status] += 1
        if tr.status != "ok":
            self.error_reasons[reason_class(tr.error or "")] += 1
        if self.progress is not None:
            self.progress.on_turn(tr.done_time, tr.prompt_tokens, tr.cached_tokens, tr.status)
        try:
            self.dispatch(self.client.on_response(self.plan_now(), tr))
        except Exception as exc:
            log.exception("client failed in on_response")
            self.finish(RunStatus.FAILED, f"client error in on_response: {exc!r}")
            return
        # A dropped connection, or a 5xx (an engine whose core died may still answer HTTP: vLLM's
        # /health then says 503), asks whether the server is still there.
        if (conn_error or (http_status is not None and http_status >= 500)) and not self._probing:
            self._probing = True
            self.loop.create_task(self._probe_server())
        self._check_finished()

    def _plan_timings(self, extra: dict[str, Any]) -> dict[str, Any]:
        """The engine's timings (its wall seconds) in plan seconds, like every time the client records."""
        for key in ENGINE_TIMINGS if self.scale != 1.0 else ():
            extra[key] = float(extra[key]) * self.scale if isinstance(extra.get(key), (int, float)) else extra.get(key)
        return {k: v for k, v in extra.items() if v is not None}

    def _failed(
        self, send: Send, status: str, t_send: float, t_first: float | None, reason: str, http_status: int | None
    ) -> TurnResponse:
        return TurnResponse(
            request_id=send.request_id,
            status=status,
            send_time=t_send,
            done_time=self.plan_now(),
            first_token_time=t_first,
            http_status=http_status,
            error=reason,
        )

    # ------------------------------------------------------------------ server health
    async def _probe_server(self) -> None:
        """After a dropped connection or a 5xx: is the server gone (FAILED) or was it one bad request?"""
        try:
            reason = self.server_alive() if self.server_alive else None
            if reason is None:
                reason = await self._health_reason()
            if reason is not None:
                self.finish(RunStatus.FAILED, f"server died: {reason}")
        finally:
            self._probing = False
            self._check_finished()

    async def _health_reason(self) -> str | None:
        """Why the server counts as gone, or None. A refused connection is proof; a reset, a
        timeout or a 5xx is not on its own (a loaded server on a quarter of a CPU can drop one
        connection and be slow to answer), so those are asked again on fresh connections,
        HEALTH_TRIES times HEALTH_GAP_S apart, and only a server failing every try is gone."""
        import aiohttp

        reason: str | None = None
        for i in range(HEALTH_TRIES):
            if i:
                await asyncio.sleep(HEALTH_GAP_S)
            try:
                # Its own connection, closed after the answer: never one the drive's pool may hold
                # half-closed by the server's keep-alive timer.
                async with (
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
                    http.get(self.base_url + "/health", timeout=aiohttp.ClientTimeout(total=5.0)) as resp,
                ):
                    await resp.read()
                    if resp.status < 500:
                        return None
                    reason = f"/health answered {resp.status}"
            except (aiohttp.ClientConnectorError, ConnectionRefusedError) as exc:
                return f"connection refused ({exc})"
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                reason = f"/health unreachable: {type(exc).__name__}"
        return f"{reason} ({HEALTH_TRIES} tries, {HEALTH_GAP_S:g} s apart)"

    async def watchdog(self) -> None:
        """Notice a dead server process even while no request is failing (e.g. all in tool calls)."""
        while self.status is None:
            await asyncio.sleep(0.25)
            reason = self.server_alive() if self.server_alive else None
            if reason is not None:
                self.finish(RunStatus.FAILED, f"server died: {reason}")

    # ------------------------------------------------------------------ periodic work
    async def gauges(self) -> None:
        """Scrape /metrics on the plan's clock (k x interval), write one gauge row per scrape."""
        assert self.gauge_interval
        k = 0
        while self.status is None:
            due = self.wall_at(k * self.gauge_interval)
            delay = due - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.status is not None:
                return
            t = self.plan_now()
            try:
                values = await asyncio.wait_for(self.transport.scrape_metrics(self.http, self.base_url), timeout=10.0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.gauge_failures += 1
                log.warning("metrics scrape failed at plan time %.1f: %s", t, exc)
            else:
                self.gauge_scrapes += 1
                if self.recorder is not None:
                    write_gauge(self.recorder, t, values)
                if self.progress is not None:
                    self.progress.on_gauges(t, values)
            k = max(k + 1, int(self.plan_now() // self.gauge_interval) + 1)  # skip missed ticks, no burst

    async def horizon(self) -> None:
        assert self.duration is not None
        await asyncio.sleep(max(self.wall_at(self.duration) - self.loop.time(), 0.0))
        self.finish(RunStatus.COMPLETED, f"plan horizon {self.duration:g} s reached")

    async def ticker(self) -> None:
        """Feed the progress display the client's state a few times a second."""
        while self.status is None:
            self._show(self.plan_now(), len(self.inflight))
            await asyncio.sleep(0.5)

    def _show(self, t: float, in_flight: int, final: bool = False) -> None:
        assert self.progress is not None
        self.progress.update(
            t,
            in_system=_attr(self.client, "in_system"),
            in_flight=in_flight,
            held=_attr(self.client, "held"),
            errors=self.counts["error"] + self.counts["timeout"],
            final=final,
        )

    # ------------------------------------------------------------------ a drive's steps
    def install_signals(self, handle_signals: bool) -> list[int]:
        """SIGTERM/SIGINT end the drive INTERRUPTED (main thread only); returns what was installed."""
        installed: list[int] = []
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    self.loop.add_signal_handler(
                        sig, self.finish, RunStatus.INTERRUPTED, f"signal {signal.Signals(sig).name}"
                    )
                    installed.append(sig)
        return installed

    def start_helpers(self, stop_event: asyncio.Event | None) -> list[asyncio.Task[None]]:
        """The periodic tasks beside the client: gauges, horizon, watchdog, progress, external stop."""
        coros: list[Any] = []
        if self.gauge_interval:
            coros.append(self.gauges())
        if self.duration is not None:
            coros.append(self.horizon())
        if self.server_alive is not None:
            coros.append(self.watchdog())
        if self.progress is not None:
            coros.append(self.ticker())
        if stop_event is not None:

            async def _external() -> None:
                await stop_event.wait()
                self.finish(RunStatus.INTERRUPTED, "stop requested")

            coros.append(_external())
        return [self.loop.create_task(c) for c in coros]

    async def play(self) -> None:
        """Start the client and wait until the drive ends (a client error in start ends it FAILED)."""
        try:
            self.dispatch(self.client.start(self.plan_now()))
        except Exception as exc:
            log.exception("client failed in start")
            self.finish(RunStatus.FAILED, f"client error in start: {exc!r}")
        self._check_finished()
        await self.done.wait()

    async def wind_down(
        self, helpers: list[asyncio.Task[None]], installed: list[int], own_session: bool
    ) -> tuple[float, int]:
        """Whatever ended the drive: cancel timers, abandon requests in flight, stop the helpers, close
        the client (it records what is still open) and flush the recorder. Returns (plan time at
        the end, requests abandoned)."""
        end_plan = self.plan_now()
        for h in self.timers.values():
            h.cancel()
        abandoned = list(self.inflight.values())
        for t in abandoned + helpers:
            t.cancel()
        await asyncio.gather(*abandoned, *helpers, return_exceptions=True)
        for sig in installed:
            self.loop.remove_signal_handler(sig)
        close = getattr(self.client, "close", None)
        if callable(close):
            try:
                close(end_plan)
            except Exception:
                log.exception("client.close failed")
        if self.recorder is not None:
            with contextlib.suppress(Exception):
                self.recorder.flush()
        if own_session:
            await self.http.close()
        if self.progress is not None:
            with contextlib.suppress(Exception):
                self._show(end_plan, 0, final=True)
        return end_plan, len(abandoned)

    def result(self, end_plan: float, abandoned: int, wall0: float, cpu0: float) -> DriveResult:
        return DriveResult(
            status=self.status or RunStatus.COMPLETED,
            reason=self.reason,
            plan_time=end_plan,
            wall_seconds=time.monotonic() - wall0,
            cpu_seconds=time.process_time() - cpu0,
            sent=self.counts["sent"],
            ok=self.counts["ok"],
            errors=self.counts["error"],
            timeouts=self.counts["timeout"],
            abandoned=abandoned,
            gauge_scrapes=self.gauge_scrapes,
            gauge_failures=self.gauge_failures,
            error_reasons=dict(self.error_reasons),
            lateness={k: np.asarray(v, dtype=float) for k, v in self.lateness.items()},
        )


def _attr(obj: Any, name: str) -> int | None:
    v = getattr(obj, name, None)
    return int(v) if isinstance(v, (int, np.integer)) else None


async def drive(
    client: Client,
    transport: Transport,
    base_url: str,
    *,
    model_name: str = "default",
    time_scale: float = 1.0,
    request_timeout: float = 600.0,
    recorder: DriveRecorder | None = None,
    gauge_interval: float | None = 5.0,
    duration: float | None = None,
    stop_event: asyncio.Event | None = None,
    server_alive: Callable[[], str | None] | None = None,
    progress: DriveProgress | None = None,
    handle_signals: bool = True,
    session: aiohttp.ClientSession | None = None,
) -> DriveResult:
    """Play `client` against the server at `base_url` until it finishes, the horizon, a stop or a
    failure; returns how it ended. Never raises for anything the server does.

    transport: an EngineAdapter (builds request bodies, parses replies, scrapes /metrics).
    request_timeout: WALL seconds a turn may take end to end before it is recorded as 'timeout'.
    gauge_interval: PLAN seconds between /metrics scrapes (None: no scrapes).
    duration: PLAN seconds after which the drive ends (None: when the client is finished).
    server_alive: returns a reason string once the server process is gone (e.g. from its
        Popen handle); checked by a watchdog and, with GET /health, after every dropped
        connection or 5xx reply.
    progress: a harness.recording.progress.RunProgress (or anything with its DriveProgress methods).
    handle_signals: SIGTERM/SIGINT end the drive as INTERRUPTED (main thread only).
    """
    if time_scale <= 0:
        raise ValueError(f"time_scale must be positive, got {time_scale}")
    cpu0 = time.process_time()
    wall0 = time.monotonic()
    own_session = session is None
    d = _Driver(
        client,
        transport,
        base_url,
        model_name=model_name,
        time_scale=time_scale,
        request_timeout=request_timeout,
        recorder=recorder,
        gauge_interval=gauge_interval,
        duration=duration,
        server_alive=server_alive,
        progress=progress,
        session=session if session is not None else _open_session(),
    )
    installed = d.install_signals(handle_signals)
    helpers: list[asyncio.Task[None]] = []
    try:
        helpers = d.start_helpers(stop_event)
        await d.play()
    except asyncio.CancelledError:
        d.finish(RunStatus.INTERRUPTED, "driver cancelled")
        raise
    finally:
        end_plan, abandoned = await d.wind_down(helpers, installed, own_session)
    return d.result(end_plan, abandoned, wall0, cpu0)


def _open_session() -> aiohttp.ClientSession:
    """The drive's own HTTP session (harness/servers/keepalive.py: no connection cap, idle connections
    closed before the server's keep-alive timer). Timeouts are per request (asyncio.timeout) so
    that they cover the whole reply."""
    import aiohttp

    return engine_session(timeout=aiohttp.ClientTimeout(total=None), skip_auto_headers=("User-Agent",))
