"""The one interface the harness uses to launch, talk to and stop a serving engine.

Every engine-specific fact (flags, request and response shapes, how to flush the prefix cache,
which /metrics series mean what) lives in one subclass, so the asyncio driver, the smoke test and
the canary are written once. Launching is synchronous (it happens before a run, between runs,
and may block for a minute); everything on the request path is async and uses the caller's
aiohttp session, so the driver controls connection limits and timeouts.

Keep the public names stable: the driver, the runner and the emulator adapter code against them
(docs/architecture.md, "Engine adapter contract").
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import errno
import os
import re
import shlex
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from harness.errors import ConfigError, EngineError
from harness.servers.cpuquota import apply, remove, wrap
from harness.servers.metrics import COMMON_METRICS, map_metrics, parse_prometheus

if TYPE_CHECKING:  # aiohttp is imported lazily so launching works in thin environments
    import aiohttp

    from harness.config import CellConfig

COMPLETIONS_PATH = "/v1/completions"
HEALTH_PATH = "/health"
METRICS_PATH = "/metrics"
LOG_NAME = "server.log"


# ---------------------------------------------------------------------------------------------
# errors and records
# ---------------------------------------------------------------------------------------------
class EngineStartError(EngineError):
    """The server did not come up. `reason` is 'port_in_use', 'exited' or 'never_healthy'.

    The message is one line: what happened, what the server log says (its last meaningful line:
    the cause, a bad flag, an OOM, a missing model, is almost always printed there and nowhere
    else) and where the log is, so every command that launches an engine ends with that line. The
    log's tail stays in `log_tail`. Picklable with all of it, so a worker process can raise it.
    """

    def __init__(self, reason: str, message: str, log_tail: str = "", log_path: Path | str | None = None) -> None:
        self.reason = reason
        self.message = message
        self.log_tail = log_tail
        self.log_path = None if log_path is None else str(log_path)
        said = last_said(log_tail)
        text = message + (f"; the server log says: {said}" if said else "")
        if self.log_path is not None:
            text += f" (server log: {self.log_path})"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.reason, self.message, self.log_tail, self.log_path))


class FlushError(EngineError):
    """The prefix cache could not be flushed (busy past the deadline, or the engine refused)."""


class ResponseError(EngineError):
    """A completion response the client cannot use; the turn is recorded with status 'error'."""

    status = "error"

    def __init__(self, reason: str, http_status: int | None = None) -> None:
        self.reason = reason
        self.http_status = http_status
        super().__init__(f"HTTP {http_status}: {reason}" if http_status is not None else reason)


@dataclass(frozen=True)
class ServerHandle:
    """A server this process started (process set) or one it was pointed at (process None)."""

    base_url: str
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    pid: int | None = None
    cpu_group: str | None = None  # the engine CPU quota's cgroup (harness/servers/cpuquota.py), removed at stop


@dataclass(frozen=True)
class ParsedTurn:
    """What one completion response says, in the harness's terms."""

    output_ids: np.ndarray
    prompt_tokens: int | None
    cached_tokens: int
    completion_tokens: int | None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


# ---------------------------------------------------------------------------------------------
# helpers shared by the adapters
# ---------------------------------------------------------------------------------------------
def port_in_use(host: str, port: int) -> bool:
    """True if something listens on (host, port).

    SO_REUSEADDR makes bind() fail only for a live listener, not for sockets in TIME_WAIT left by
    the previous server on the same port, which would otherwise block back-to-back runs.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that is free now (tests and the smoke command use it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def log_tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        fh.seek(max(0, size - 64 * 1024))
        data = fh.read().decode("utf-8", errors="replace")
    return "\n".join(data.splitlines()[-lines:])


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# an exception stated: "ValueError: ...", "torch.OutOfMemoryError: ..." (after any log prefix)
_EXCEPTION = re.compile(r"(?:^|\s)((?:[A-Za-z_][\w.]*)?(?:Error|Exception)\b:\s.*)$")
# any line that states a failure: an exception, a logged ERROR or CRITICAL, an argparse refusal, a kill
_FAILURE = re.compile(r"\b\w*(Error|Exception)\b|\b(ERROR|CRITICAL|FATAL)\b|\berror:|\bKilled\b|out of memory", re.I)
# a wrapper that points elsewhere ("Engine core initialization failed. See root cause above."): not the cause
_DEFERS = re.compile(r"root cause|see above|stack trace|see the (log|traceback)", re.I)
SAID_LINES = 400  # how far back in the log the cause is looked for (vLLM prints ~120 lines after it)


def last_said(tail: str, limit: int = 300) -> str:
    """The last meaningful line of a server log's tail, '' for an empty log: the last exception
    stated that is not a wrapper pointing elsewhere (from its name on, past the log prefix), else
    the last line stating a failure, else the last non-empty line; never the harness's own marker.

    Why this order: an engine that fails to start prints its cause once, then the wrappers of each
    process it crosses (vLLM: the worker's ValueError, then "WorkerProc initialization failed ... See
    stack trace for root cause", then "Engine core initialization failed. See root cause above")."""
    lines = []
    for raw in tail.splitlines():
        line = " ".join(_ANSI.sub("", raw).split())
        if line and not line.startswith("=== agentload"):
            lines.append(line)
    said = ""
    for line in reversed(lines):
        m = _EXCEPTION.search(line)
        if m and not _DEFERS.search(line):
            said = m.group(1)
            break
    if not said:
        failures = [x for x in lines if _FAILURE.search(x)]
        said = next((x for x in reversed(failures) if not _DEFERS.search(x)), failures[-1] if failures else "")
    if not said and lines:
        said = lines[-1]
    return said if len(said) <= limit else said[: limit - 3] + "..."


def _flag_name(arg: str) -> str:
    """'--no-enable-x=1' -> 'enable-x': a flag and its negation, with or without '=value', are one flag."""
    name = arg.split("=", 1)[0].removeprefix("--")
    return name.removeprefix("no-")


def with_launch_extras(cell: CellConfig, argv: list[str], own: Sequence[str]) -> list[str]:
    """`argv` with the cell's launch extras (CellConfig.launch_extras) appended. `own` is the part
    of argv the cell's other fields produced: an extra that names one of its flags again (or its
    negation) would contradict the cell on record, so it is refused, naming the cell and the flag."""
    extras = list(cell.launch_extras or ())
    taken = {_flag_name(a) for a in own if a.startswith("--")}
    for arg in extras:
        if arg.startswith("--") and _flag_name(arg) in taken:
            raise ConfigError(
                f"cell {cell.name}: launch_extras: got {arg!r}, a flag the cell's other fields already set; "
                "expected only arguments the cell does not imply (change the cell's field instead)"
            )
    return [*argv, *extras]


def _http_status(url: str, timeout: float) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return None


def wait_healthy(
    base_url: str,
    *,
    timeout: float,
    process: subprocess.Popen[bytes] | None = None,
    interval: float = 0.5,
    health_path: str = HEALTH_PATH,
) -> float:
    """Poll GET health_path until 200; returns the seconds waited.

    Raises EngineStartError('exited') as soon as the process dies (no point waiting out the
    deadline for a server that already printed its traceback) and 'never_healthy' at the deadline.
    """
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise EngineStartError("exited", f"server exited with code {process.returncode} before it became healthy")
        if _http_status(base_url + health_path, timeout=min(5.0, max(0.5, deadline - time.monotonic()))) == 200:
            return time.monotonic() - t0
        if time.monotonic() >= deadline:
            raise EngineStartError(
                "never_healthy", f"{base_url}{health_path} did not answer 200 within {timeout:.0f} s"
            )
        time.sleep(interval)


def as_int(value: Any, what: str, http_status: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResponseError(f"{what} is not an integer ({value!r})", http_status)
    return value


def error_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:300].decode("utf-8", errors="replace").strip() or "empty body"
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            msg = err.get("message") or err.get("detail") or err
        else:
            msg = data.get("message") or data.get("detail") or err
        return str(msg)[:300]
    return str(data)[:300]


def answer_object(http_status: int, body: bytes) -> dict[str, Any]:
    """A turn's answer as a JSON object, or the ResponseError each dialect's parser raises for a
    non-2xx status (with the engine's own message), a body that is not JSON, or not an object."""
    if not 200 <= http_status < 300:
        raise ResponseError(error_message(body), http_status)
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise ResponseError("malformed JSON", http_status) from None
    if not isinstance(data, dict):
        raise ResponseError("response is not a JSON object", http_status)
    return data


def is_id_list(ids: Any) -> bool:
    """Whether an answer's token ids are a list of plain integers (a bool is not a token id)."""
    return isinstance(ids, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in ids)


# ---------------------------------------------------------------------------------------------
# the adapter
# ---------------------------------------------------------------------------------------------
class EngineAdapter(abc.ABC):
    """One engine dialect. Instances hold only configuration (no connection state), so one
    adapter may serve many runs and be shared across tasks."""

    name: str = "abstract"
    block_size: int = 1
    # (cgroup name, cores) of the cell last launched with an engine CPU quota (harness/servers/cpuquota.py),
    # applied once the server is healthy; set from the cell by launch_command, like block_size
    cpu_quota: tuple[str, float] | None = None

    def __init__(self, *, server_cmd: Sequence[str] | None = None, block_size: int | None = None) -> None:
        self.server_cmd = list(server_cmd) if server_cmd else None
        if block_size is not None:
            self.block_size = int(block_size)

    # -- launching ------------------------------------------------------------------------
    @abc.abstractmethod
    def launch_command(
        self,
        cell: CellConfig,
        *,
        model: str,
        host: str,
        port: int,
        extra_args: Sequence[str] = (),
    ) -> tuple[list[str], dict[str, str]]:
        """argv and the environment additions that start this engine as `cell` describes."""

    def under_cpu_quota(self, cell: CellConfig, argv: list[str], port: int) -> list[str]:
        """`argv` wrapped to run under the cell's engine CPU quota (harness/servers/cpuquota.py), which
        `start` applies once the server is healthy; `argv` unchanged for a cell without one."""
        self.cpu_quota = None
        if cell.engine_cpu_quota is None:
            return argv

        name = f"{self.name}-{port}"
        self.cpu_quota = (name, cell.engine_cpu_quota)
        return wrap(argv, cell.engine_cpu_quota, name, after_healthy=True)

    def start(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        run_dir: Path,
        *,
        host: str,
        port: int,
        health_timeout: float,
    ) -> ServerHandle:
        """Start the server in its own process group, logging to run_dir/server.log.

        Own group: stop() must reach the engine's worker processes too (vLLM's EngineCore,
        SGLang's scheduler and detokenizer), and a Ctrl-C at the harness must not hit the
        server before the harness has recorded what it needs.
        """
        base_url = f"http://{host}:{port}"
        if port_in_use(host, port):
            raise EngineStartError(
                "port_in_use", f"port {port} on {host} is already in use; another server is running there"
            )
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        log_path = run_dir / LOG_NAME
        full_env = {**os.environ, **env}
        with log_path.open("ab") as log:
            added = " ".join(f"{k}={v}" for k, v in env.items())
            log.write(
                f"\n=== agentload start {time.strftime('%Y-%m-%dT%H:%M:%S%z')}: {added} {shlex.join(argv)}\n".encode()
            )
            log.flush()
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                start_new_session=True,
            )
        handle = ServerHandle(base_url=base_url, process=proc, log_path=log_path, pid=proc.pid)
        try:
            wait_healthy(base_url, timeout=health_timeout, process=proc, health_path=self.health_path)
            if self.cpu_quota is not None:  # the cell's CPU quota, from now on (the start is not measured)
                got = apply(*self.cpu_quota)
                handle = dataclasses.replace(handle, cpu_group=self.cpu_quota[0])
                with log_path.open("ab") as log:
                    log.write(
                        f"\n=== agentload: engine CPU quota {got:g} CPU "
                        f"from {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n".encode()
                    )
        except EngineStartError as exc:
            self.stop(handle, grace=5.0)
            raise EngineStartError(exc.reason, exc.message, log_tail(log_path, SAID_LINES), log_path) from None
        except BaseException:
            self.stop(handle, grace=5.0)
            raise
        return handle

    def stop(self, handle: ServerHandle, *, grace: float = 10.0) -> None:
        """SIGTERM the whole group, wait `grace`, then SIGKILL whatever is left of it."""
        proc = handle.process
        if proc is None:
            return
        try:
            pgid = os.getpgid(proc.pid)
        except ProcessLookupError:
            pgid = proc.pid  # leader gone; its session id equals its pid (start_new_session)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
        # The leader may exit before its workers finish their own shutdown: give the group the
        # rest of the grace period, then SIGKILL what is left. An orphaned engine worker holding
        # the port or gigabytes of memory is the worst failure on a shared node.
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(pgid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5.0)
        if handle.cpu_group is not None:
            remove(handle.cpu_group)  # empty now; a leftover process keeps it (and says so by failing)

    health_path: str = HEALTH_PATH

    def max_prompt_tokens(self, cell: CellConfig, max_tokens: int) -> int:
        """The longest prompt the server serves in full with `max_tokens` to generate: vLLM 0.32
        takes up to context - 1 tokens but cuts max_tokens to what is left of the context, so a
        whole completion needs prompt + max_tokens <= context. The smoke test's long-context check
        sends this much when the cell's context is below the workload's longest prompt."""
        return cell.context_length - max_tokens

    def served_model_name(self, cell: CellConfig) -> str:
        """The name requests must carry; the server is launched with it (--served-model-name)."""
        return cell.model

    # -- requests -------------------------------------------------------------------------
    def completion_request(self, prompt: np.ndarray, max_tokens: int, model_name: str) -> tuple[str, bytes]:
        """A greedy, fixed-length completion over token ids, asking for the output ids back.

        ignore_eos + max_tokens = d makes every turn exactly d tokens (the workload's d), and the
        returned ids are fed into the next prompt so a follow-up can hit the whole prefix.
        """
        body = {
            "model": model_name,
            "prompt": np.asarray(prompt).astype(np.int64, copy=False).tolist(),
            "max_tokens": int(max_tokens),
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "stream": False,
        }
        return COMPLETIONS_PATH, orjson.dumps(body)

    def parse_completion(self, http_status: int, body: bytes) -> ParsedTurn:
        data = answer_object(http_status, body)
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ResponseError("missing choices[0]", http_status)
        choice = choices[0]
        ids = choice.get("token_ids")
        if ids is None:
            raise ResponseError("missing choices[0].token_ids (was return_token_ids honoured?)", http_status)
        if not is_id_list(ids):
            raise ResponseError("choices[0].token_ids is not a list of integers", http_status)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            raise ResponseError("missing usage", http_status)
        if usage.get("prompt_tokens") is None:
            raise ResponseError("missing usage.prompt_tokens", http_status)
        prompt_tokens = as_int(usage["prompt_tokens"], "usage.prompt_tokens", http_status)
        completion = usage.get("completion_tokens")
        completion_tokens = None if completion is None else as_int(completion, "usage.completion_tokens", http_status)
        details = usage.get("prompt_tokens_details")
        cached = 0  # absent or null details = nothing cached (neither engine omits them at 0 today)
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            cached = as_int(details["cached_tokens"], "usage.prompt_tokens_details.cached_tokens", http_status)
        extra: dict[str, Any] = {}
        if choice.get("finish_reason") is not None:
            extra["finish_reason"] = choice["finish_reason"]
        pids = choice.get("prompt_token_ids")
        if isinstance(pids, list):
            extra["server_prompt_len"] = len(pids)
        extra.update(_engine_timings(data.get("metrics")))
        return ParsedTurn(
            output_ids=np.asarray(ids, dtype=np.int32),
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            completion_tokens=completion_tokens,
            extra=extra,
        )

    async def complete(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        prompt: np.ndarray,
        max_tokens: int,
        model_name: str,
        *,
        timeout: float = 600.0,
    ) -> ParsedTurn:
        """One request round trip (smoke, canary, tests); the driver times its own requests."""
        import aiohttp

        path, body = self.completion_request(prompt, max_tokens, model_name)
        async with http.post(
            base_url + path,
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            return self.parse_completion(resp.status, raw)

    # -- cache and metrics -----------------------------------------------------------------
    @abc.abstractmethod
    async def flush_cache(self, http: aiohttp.ClientSession, base_url: str, *, timeout: float = 60.0) -> None:
        """Empty the prefix cache or raise FlushError; callers verify with the canary."""

    metric_map: Mapping[str, Any] = {}

    async def scrape_metrics(self, http: aiohttp.ClientSession, base_url: str) -> dict[str, float]:
        """One /metrics scrape mapped to COMMON_METRICS names (a series the engine lacks is absent)."""
        import aiohttp

        async with http.get(base_url + METRICS_PATH, timeout=aiohttp.ClientTimeout(total=10.0)) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"GET {base_url}{METRICS_PATH} answered {resp.status}: {text[:200]}")
        return self.map_metrics_text(text)

    def map_metrics_text(self, text: str) -> dict[str, float]:
        return map_metrics(parse_prometheus(text), self.metric_map)

    common_metrics: tuple[str, ...] = COMMON_METRICS

    # -- smoke helpers ---------------------------------------------------------------------
    def expected_settings(self, cell: CellConfig) -> dict[str, Any]:
        """Settings the server should report back for `cell` (compared by Stage 0)."""
        return {}

    async def server_settings(self, http: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
        """Settings as the running server reports them; keys it does not expose are left out."""
        return {}

    def describe(self) -> dict[str, Any]:
        """What goes into a run's meta.json about the adapter itself."""
        return {"adapter": self.name, "block_size": self.block_size, "server_cmd": self.server_cmd}


def _engine_timings(metrics: Any) -> dict[str, float]:
    """The engine's own per-request timings, in seconds, where the response carries them.

    vLLM (--enable-per-request-metrics) answers `metrics` with queue_time_ms (queued to first
    scheduled), time_to_first_token_ms (scheduled to first token) and generation_time_ms (first to
    last token), from its engine-core timestamps: what a cost model is fitted to (App. E.9).
    """
    if not isinstance(metrics, dict):
        return {}
    out: dict[str, float] = {}
    for key, name in (
        ("queue_time_ms", "queue_time"),
        ("time_to_first_token_ms", "engine_ttft"),
        ("generation_time_ms", "engine_decode"),
    ):
        v = metrics.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            out[name] = float(v) / 1000.0
    return out
