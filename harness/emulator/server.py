"""The HTTP emulator: the reference engine model behind SGLang's or vLLM's HTTP API, in real time.

Why it exists: the real-time client path (sockets, JSON of 40k-id prompts, timeouts, crashes, the
metrics scrape, the flush and canary) must be testable on a laptop or CI runner with no GPU, and a
run against the emulator must be comparable to the same plan run in virtual time. So the server is
only a clock and a transport around `EngineModel`: one background task runs iterations (step, sleep
until the iteration's end, complete, wake the waiting handlers), and `--time-scale X` makes X
seconds of engine time pass per wall second so that a long protocol fits in a test.

The engine clock may lead the wall clock by at most `_MAX_LEAD` wall seconds: iterations shorter
than that are not slept individually (the event loop's sleep granularity would otherwise slow the
emulated engine down at high time scales), yet replies are never sent noticeably early.

Fault injection (`--fault`, TEST-ONLY, never used by registered runs): makes the server fail in the
ways a real engine does, so that the driver's crash handling is exercised end to end:
  die-after:N   the process exits abruptly when the N-th completion request arrives
  5xx:N         every N-th completion request gets a 500 error body
  malformed:N   every N-th completion gets a 200 whose body is truncated JSON
  no-usage:N    every N-th completion gets a 200 without the `usage` object
  hang:N        every N-th completion request is never answered
  unhealthy     /health answers 503 forever (a server that never becomes ready)

Gauges, as SGLang 0.5.22 reports them: its scheduler publishes running, waiting and the KV pool
gauges on events, not per scrape: after each prefill batch, every 40th decode step, when it falls
idle with a stale running count, and every 30 s while idle. So /metrics can lag, e.g. a flush of
an idle server shows in kv_evictable_tokens only at the next batch (or 30 s later). The emulator's
SGLang dialect publishes on the same events; its vLLM dialect reads the model at each scrape.

Health, as SGLang 0.5.22 answers it: 503 while the server warms up (`warmup` wall seconds after the
engine starts), then each /health takes `health_poll` wall seconds (SGLang's handler checks once a
second for a reply of the one-token generation it queues). vLLM answers at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from harness.emulator import flavors
from harness.emulator.core import (
    FLUSH_IN_PROGRESS,
    FLUSH_OK,
    FLUSH_REFUSED,
    FLUSH_TIMED_OUT,
    ORJSON_OPTS,
    VERSION,
    Emulator,
    Faults,
    Reply,
)

log = logging.getLogger("agentload.emulator")

__all__ = ["Emulator", "Faults", "make_app", "serve"]


# ---------------------------------------------------------------------------------------------
# HTTP handlers
# ---------------------------------------------------------------------------------------------
_EMU = web.AppKey("emulator", Emulator)


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(obj, option=ORJSON_OPTS), content_type="application/json")


async def _load_json(request: web.Request, emu: Emulator) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError as exc:
        raise emu.bad_request(f"invalid JSON body: {exc}") from exc
    if not isinstance(body, dict):
        raise emu.bad_request("the request body must be a JSON object")
    return body


async def _run_turn(
    emu: Emulator,
    prompt: np.ndarray,
    max_tokens: int,
    *,
    streaming: bool = False,
    on_tokens: Callable[[int, np.ndarray], None] | None = None,
) -> tuple[Any, str | None]:
    """Count the request, apply any injected fault, run it on the engine."""
    emu.stats.requests += 1
    fault = emu.fault_for(emu.stats.requests)
    if fault == "die":
        log.error("fault die-after: exiting on request %d", emu.stats.requests)
        emu.die()
        await asyncio.Event().wait()  # an in-process die() that returned: never answer
    if fault == "hang":
        await asyncio.Event().wait()
    if fault == "5xx":
        raise Reply(
            web.Response(
                status=500,
                body=orjson.dumps(flavors.error_body(emu.flavor, "injected server error", 500, "InternalServerError")),
                content_type="application/json",
            )
        )
    try:
        comp = await emu.submit(prompt, max_tokens, on_tokens)
    except ValueError as exc:  # the model refuses what the engine would (context overflow)
        raise emu.bad_request(str(exc)) from None
    except RuntimeError as exc:
        raise Reply(_json(flavors.error_body(emu.flavor, str(exc), 500, "InternalServerError"), 500)) from None
    emu.stats.count_finished(streaming, int(comp.prompt_tokens), int(comp.completion_tokens), int(comp.cached_tokens))
    return comp, fault


def _max_tokens(emu: Emulator, value: Any, default: int = 16) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise emu.bad_request(f"max_tokens must be a positive integer, got {value!r}")
    return value


async def completions(request: web.Request) -> web.StreamResponse:
    emu = request.app[_EMU]
    try:
        body = await _load_json(request, emu)
        prompt = emu.parse_prompt(body.get("prompt"))
        max_tokens = _max_tokens(emu, body.get("max_tokens"))
        max_tokens = emu.check_fits(prompt, max_tokens)
        if body.get("stream"):
            return await _stream(request, emu, body, prompt, max_tokens)
        comp, fault = await _run_turn(emu, prompt, max_tokens)
    except Reply as r:
        return r.response
    out = np.asarray(comp.output_ids, dtype=np.int32)
    return_ids = bool(body.get("return_token_ids", False))
    resp = flavors.completion_body(
        emu.flavor,
        model=body.get("model") or emu.model_name,
        prompt_ids=prompt,
        output_ids=out,
        prompt_tokens=int(comp.prompt_tokens),
        cached_tokens=int(comp.cached_tokens),
        completion_tokens=int(comp.completion_tokens),
        return_ids=return_ids,
        with_usage=fault != "no-usage",
    )
    if fault == "malformed":
        raw = orjson.dumps(resp, option=ORJSON_OPTS)
        return web.Response(status=200, body=raw[: max(len(raw) // 2, 1)], content_type="application/json")
    return _json(resp)


def _sse(chunk: Any) -> bytes:
    return b"data: " + orjson.dumps(chunk, option=ORJSON_OPTS) + b"\n\n"


def engine_timings(emu: Emulator, comp: Any) -> tuple[float, float, float]:
    """(queued -> scheduled, scheduled -> first token, first -> last token) of a completion, in
    wall seconds as an engine reports them (the engine clock runs time_scale times faster)."""
    s = emu.time_scale
    admit = comp.admit_time if comp.admit_time == comp.admit_time else comp.submit_time
    return (
        (admit - comp.submit_time) / s,
        (comp.first_token_time - admit) / s,
        (comp.done_time - comp.first_token_time) / s,
    )


async def _stream(
    request: web.Request, emu: Emulator, body: dict[str, Any], prompt: np.ndarray, max_tokens: int
) -> web.StreamResponse:
    """A `stream: true` completion, as the engines stream it: the headers and one chunk per token as
    the model's iterations produce them (Emulator.submit's on_tokens), the finish reason on the
    last, then the usage chunk when asked for (vLLM's with its per-request metrics) and [DONE]. A
    request refused before its first token gets the plain error response, as from the engines."""
    events: asyncio.Queue[tuple[int, np.ndarray]] = asyncio.Queue()
    turn = asyncio.ensure_future(
        _run_turn(emu, prompt, max_tokens, streaming=True, on_tokens=lambda n, out: events.put_nowait((n, out)))
    )
    return_ids = bool(body.get("return_token_ids", False))
    base = flavors.stream_base(body.get("model") or emu.model_name)
    sresp: web.StreamResponse | None = None
    sent = 0

    async def send(ids: np.ndarray, upto: int, last: bool) -> None:
        nonlocal sresp, sent
        if sresp is None:
            sresp = web.StreamResponse(
                status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
            )
            await sresp.prepare(request)
        for i in range(sent, upto):  # one chunk per token
            chunk = flavors.token_chunk(
                emu.flavor,
                base,
                ids[i : i + 1],
                first=i == 0,
                last=last and i == upto - 1,
                prompt_ids=prompt,
                return_ids=return_ids,
            )
            await sresp.write(_sse(chunk))
        sent = max(sent, upto)

    try:
        while True:
            getter = asyncio.ensure_future(events.get())
            await asyncio.wait({turn, getter}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            n, out = getter.result()
            await send(out, n, last=False)
        try:
            comp, fault = turn.result()
        except Reply as r:
            if sresp is None:
                return r.response
            raise ConnectionResetError("the engine failed mid-stream") from None
        out_ids = np.asarray(comp.output_ids, dtype=np.int32)
        await send(out_ids, len(out_ids), last=True)
        assert sresp is not None
        if bool((body.get("stream_options") or {}).get("include_usage", False)) and fault != "no-usage":
            usage = flavors.completion_body(
                emu.flavor,
                model=base["model"],
                prompt_ids=prompt,
                output_ids=out_ids,
                prompt_tokens=int(comp.prompt_tokens),
                cached_tokens=int(comp.cached_tokens),
                completion_tokens=int(comp.completion_tokens),
                return_ids=False,
            )["usage"]
            metrics = flavors.vllm_metrics(*engine_timings(emu, comp), int(comp.completion_tokens))
            raw = _sse(flavors.usage_chunk(emu.flavor, base, usage, metrics))
            await sresp.write(raw[: len(raw) // 2] if fault == "malformed" else raw)
        await sresp.write(b"data: [DONE]\n\n")
        await sresp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        if not turn.done():  # the client went away: the engine finishes the request regardless
            turn.add_done_callback(lambda t: t.cancelled() or t.exception())
        raise
    return sresp


async def generate(request: web.Request) -> web.Response:
    """SGLang's native endpoint: input_ids + sampling_params, counts under meta_info."""
    emu = request.app[_EMU]
    t0 = time.monotonic()
    received = time.time()
    try:
        body = await _load_json(request, emu)
        raw = body.get("input_ids", body.get("text"))
        prompt = emu.parse_prompt(raw)
        sp = body.get("sampling_params") or {}
        max_tokens = _max_tokens(emu, sp.get("max_new_tokens"), default=128)
        max_tokens = emu.check_fits(prompt, max_tokens)
        comp, fault = await _run_turn(emu, prompt, max_tokens)
    except Reply as r:
        return _native_error(r.response)
    queue, ttft, decode = engine_timings(emu, comp)
    latency = time.monotonic() - t0
    finished = received + latency  # the reply leaves now: the last token's time, as the tokenizer sees it
    first = finished - decode
    resp = flavors.generate_body(
        output_ids=np.asarray(comp.output_ids, dtype=np.int32),
        prompt_tokens=int(comp.prompt_tokens),
        cached_tokens=int(comp.cached_tokens),
        completion_tokens=int(comp.completion_tokens),
        latency=latency,
        received=received,
        queue_time=queue,
        first_token_latency=max(first - received, 0.0),
        forward_entry=first - ttft,
        prefill_finished=first,
    )
    if fault == "malformed":
        raw_b = orjson.dumps(resp, option=ORJSON_OPTS)
        return web.Response(status=200, body=raw_b[: len(raw_b) // 2], content_type="application/json")
    if fault == "no-usage":
        resp.pop("meta_info")
    return _json(resp)


def _native_error(resp: web.Response) -> web.Response:
    """An error as SGLang 0.5.22's /generate answers it (_create_error_response): {"error":
    {"message"}}, not the OpenAI endpoint's flat ErrorResponse."""
    try:
        body = orjson.loads(resp.body)  # type: ignore[arg-type]
    except (orjson.JSONDecodeError, TypeError):
        return resp
    message = body.get("message") if isinstance(body, dict) else None
    if message is None:
        return resp
    return _json({"error": {"message": message}}, resp.status)


async def flush_cache(request: web.Request) -> web.Response:
    """SGLang: flush if idle; busy and no ?timeout (or 0): 400 at once; with ?timeout=S: wait for idle
    up to S, then flush (200) or give up (400). One deferred flush at a time."""
    emu = request.app[_EMU]
    raw = request.query.get("timeout", "0")
    try:
        timeout = float(raw)
    except ValueError:
        timeout = -1.0
    if not timeout >= 0.0:  # FastAPI's Query(ge=0.0) validation error
        detail = [
            {
                "type": "greater_than_equal",
                "loc": ["query", "timeout"],
                "msg": "Input should be greater than or equal to 0",
                "input": raw,
            }
        ]
        return _json({"detail": detail}, 422)
    if emu.flush_pending:
        return web.Response(status=400, text=FLUSH_IN_PROGRESS)
    if emu.try_flush():
        return web.Response(text=FLUSH_OK)
    if timeout <= 0.0:
        return web.Response(status=400, text=FLUSH_REFUSED)
    deadline = time.monotonic() + timeout
    emu.flush_pending = True
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.01)
            if emu.try_flush():
                return web.Response(text=FLUSH_OK)
    finally:
        emu.flush_pending = False
    return web.Response(status=400, text=FLUSH_TIMED_OUT)


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """vLLM: always 200; the body says whether the cache was reset (false while blocks are in use)."""
    emu = request.app[_EMU]
    return _json({"success": emu.try_flush()})


async def metrics(request: web.Request) -> web.Response:
    emu = request.app[_EMU]
    return web.Response(body=generate_latest(emu.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def health(request: web.Request) -> web.Response:
    emu = request.app[_EMU]
    if emu.faults.unhealthy or emu._dead or not emu.healthy_now():
        return web.Response(status=503, text=emu._dead or "")
    if emu.health_poll > 0:
        await asyncio.sleep(emu.health_poll)
        if emu._dead:
            return web.Response(status=503, text=emu._dead)
    return web.Response(status=200)


async def models(request: web.Request) -> web.Response:
    emu = request.app[_EMU]
    return _json(flavors.models_body(emu.model_name, emu.cell.context_length))


async def server_info(request: web.Request) -> web.Response:
    emu = request.app[_EMU]
    info = flavors.server_info(
        emu.flavor, model=emu.model_name, cell=emu.cell, time_scale=emu.time_scale, version=VERSION[emu.flavor]
    )
    info["stats"] = {
        "requests": emu.stats.requests,
        "completed": emu.stats.completed,
        "rejected": emu.stats.rejected,
        "faults": emu.stats.faults,
    }
    return _json(info)


async def version(request: web.Request) -> web.Response:
    return _json({"version": VERSION[request.app[_EMU].flavor]})


def make_app(emulator: Emulator) -> web.Application:
    """The aiohttp application; the engine task starts and stops with it."""
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[_EMU] = emulator

    async def _lifecycle(app: web.Application):  # type: ignore[no-untyped-def]
        await emulator.start()
        yield
        await emulator.close()

    app.cleanup_ctx.append(_lifecycle)
    r = app.router
    r.add_post("/v1/completions", completions)
    r.add_get("/metrics", metrics)
    r.add_get("/health", health)
    r.add_get("/v1/models", models)
    r.add_get("/server_info", server_info)
    r.add_get("/get_server_info", server_info)
    if emulator.flavor == "sglang":
        r.add_post("/generate", generate)
        r.add_get("/flush_cache", flush_cache)
        r.add_post("/flush_cache", flush_cache)
        r.add_get("/health_generate", health)
    else:
        r.add_post("/reset_prefix_cache", reset_prefix_cache)
        r.add_get("/version", version)  # SGLang 0.5.22 has none (404); its /server_info has `version`
    return app


async def serve(emulator: Emulator, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Start serving in the running loop; returns the runner (call .cleanup()) and the base URL."""
    # a short shutdown: a stopped engine does not finish its requests either (and hung ones never would)
    runner = web.AppRunner(make_app(emulator), access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=False)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound = sock.getsockname()[1]
    return runner, f"http://{host}:{bound}"
