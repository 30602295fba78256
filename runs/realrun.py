"""The real-engine path of a run: launch (or attach to) a server, check it, drive the plan, stop it.

The runner (runs/arms.py) builds the plan client, the recorder and the run directory exactly
as for a simulated run and hands them here when the engine is not the simulator; everything that
differs between a virtual and a real engine is in this module, so the two paths share all of their
bookkeeping. Order of a real run (App. E.2): fresh server, smoke checks, cache flush and canary,
then the arm on the plan's clock, then the server is stopped whatever happened.

Outcomes are written to the run's meta.json through the recorder: the status (COMPLETED,
INTERRUPTED, FAILED) with its reason, a `flagged` bit when any turn failed, and a summary of the
drive (turn counts by status, error reasons, timer lateness, client CPU). The caller closes the
recorder; rows written before a failure are kept.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shlex
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from harness.client.contract import Client
from harness.config import CellConfig, resolve_path
from harness.drivers.drive_result import DriveResult
from harness.drivers.sinks import DriveProgress, DriveRecorder
from harness.drivers.wall import drive
from harness.errors import ConfigError, EngineError
from harness.recording.progress import RunProgress
from harness.recording.schema import RunStatus
from harness.servers import EngineStartError, cpuquota, get_adapter, smoke
from harness.servers.cpudtype import refusal_hint
from harness.servers.keepalive import engine_session
from harness.servers.portstart import start_on_free_port
from harness.servers.speedpin import SpeedPinError, pin_blocking, recheck
from runs.backend import Backend, BackendResult, RunContext, register_backend

log = logging.getLogger("agentload.realrun")

REAL_ENGINES = ("emulator", "vllm", "sglang")
ENGINE_DID_NOT_START = "engine did not start"  # how the reason of a run whose server never came up begins


@dataclass(frozen=True)
class EngineOptions:
    """How to reach the engine of a real run (from the `run` command's engine options)."""

    engine: str = "emulator"  # emulator | vllm | sglang (or emulator:sglang / emulator:vllm)
    flavor: str | None = None  # emulator dialect; default: the cell's engine
    time_scale: float = 1.0  # plan seconds per wall second (emulator clock; a real engine: runs/host_scale.py)
    server_cmd: tuple[str, ...] | None = None  # program prefix replacing the default launcher
    base_url: str | None = None  # an already running server: no launch, no stop
    model: str | None = None  # weights for the engine's --model (default: the cell's model)
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None  # default: a free port
    extra_args: tuple[str, ...] = ()
    health_timeout: float = 900.0
    request_timeout: float = 600.0  # wall seconds per turn before it is recorded as a timeout
    smoke: bool = True
    canary: bool = True
    cell_ref: str | None = None  # how the emulator finds the cell (path or configs/cells name)
    # The speed pin's first quota (default: the cell's engine_cpu_quota). Why: on one host the quota a
    # run was pinned at is the best first guess for the next run there (CI's reduced test passes its
    # first arm's to the second), and each probe costs ~10 s; the pin still probes until it reads the
    # cell's speed, so the start changes how soon it gets there, never where (recorded in meta.json).
    pin_start: float | None = None

    @property
    def engine_kind(self) -> str:
        return self.engine.partition(":")[0]


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """The `run` command's options for real engines (the runner adds them to its parser)."""
    g = p.add_argument_group("real engines (--engine emulator|vllm|sglang)")
    g.add_argument(
        "--server-cmd",
        default=None,
        help="launcher prefix replacing the engine's default program, "
        "e.g. '.engine-venv/vllm/bin/python -m vllm.entrypoints.openai.api_server'",
    )
    g.add_argument("--base-url", default=None, help="drive an already running server at this URL (no launch, no stop)")
    g.add_argument(
        "--flavor", choices=("sglang", "vllm"), default=None, help="emulator API dialect (default: the cell's engine)"
    )
    g.add_argument("--time-scale", type=float, default=1.0, help="emulator only: plan seconds per wall second")
    g.add_argument("--model-path", default=None, help="weights the engine loads (default: the cell's model)")
    g.add_argument("--served-model-name", default=None)
    g.add_argument("--port", type=int, default=None, help="server port on 127.0.0.1 (default: a free one)")
    g.add_argument(
        "--engine-arg", action="append", default=[], metavar="ARG", help="extra server argument (repeatable)"
    )
    g.add_argument("--health-timeout", type=float, default=900.0, help="seconds to wait for /health (default 900)")
    g.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="wall seconds per turn before it is a timeout (default 600)",
    )
    g.add_argument("--no-smoke", action="store_true", help="skip the pre-run smoke checks")
    g.add_argument("--no-canary", action="store_true", help="skip the flush + canary check (exploratory runs only)")
    g.add_argument(
        "--progress-every", type=float, default=30.0, help="seconds between progress lines when not on a terminal"
    )


def options_from_args(args: argparse.Namespace, *, cell_ref: str | None = None) -> EngineOptions:
    return EngineOptions(
        engine=args.engine,
        flavor=getattr(args, "flavor", None),
        time_scale=float(getattr(args, "time_scale", 1.0)),
        server_cmd=tuple(shlex.split(args.server_cmd)) if getattr(args, "server_cmd", None) else None,
        base_url=getattr(args, "base_url", None),
        model=getattr(args, "model_path", None),
        served_model_name=getattr(args, "served_model_name", None),
        port=getattr(args, "port", None),
        extra_args=tuple(getattr(args, "engine_arg", ()) or ()),
        health_timeout=float(getattr(args, "health_timeout", 900.0)),
        request_timeout=float(getattr(args, "request_timeout", 600.0)),
        smoke=not getattr(args, "no_smoke", False),
        canary=not getattr(args, "no_canary", False),
        cell_ref=cell_ref,
    )


class RunRecord(DriveRecorder, Protocol):
    """The recorder a real run writes to (harness.recording.record.RunRecorder): the drive's gauges
    and flush, what is learned on the way into meta.json, and the status the drive ended with."""

    def update_meta(self, values: Mapping[str, Any]) -> None: ...

    def set_status(self, status: str, reason: str | None = None) -> None: ...


@dataclass(frozen=True)
class EngineLaunch:
    """meta.json `engine_launch`: the server's command line, environment and port."""

    argv: list[str]
    env: dict[str, str]
    port: int

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "env": self.env, "port": self.port}


@dataclass(frozen=True)
class EngineStart:
    """meta.json `engine_start`: when the server was launched and answered /health (UTC), and the
    seconds in between; a job's start allowance is judged against them."""

    launched_at: str
    healthy_at: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"launched_at": self.launched_at, "healthy_at": self.healthy_at, "seconds": self.seconds}


class _Interrupted(Exception):
    """SIGTERM/SIGINT outside the drive (while launching or checking the server)."""


def _raise_interrupted(signum: int, _frame: Any) -> None:
    raise _Interrupted(f"signal {signal.Signals(signum).name}")


def _install_interrupt() -> None:
    """(Re)install the handler: the event loop resets SIGTERM to its default when a drive ends."""
    with contextlib.suppress(ValueError):  # not the main thread: leave signals alone
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, _raise_interrupted)


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn SIGTERM/SIGINT into an exception so the server is stopped and the status written."""
    old = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    _install_interrupt()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            for s, h in old.items():
                signal.signal(s, h)


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def _failed(status: RunStatus, reason: str, t0: float) -> DriveResult:
    return DriveResult(status=status, reason=reason, plan_time=0.0, wall_seconds=time.monotonic() - t0, cpu_seconds=0.0)


def run_real(
    client: Client,
    *,
    cell: CellConfig,
    options: EngineOptions,
    run_dir: Path | str,
    recorder: RunRecord | None = None,
    duration: float | None = None,
    gauge_interval: float | None = 5.0,
    progress: DriveProgress | None = None,
) -> DriveResult:
    """Launch or attach, smoke + canary, drive `client`, stop; the status goes to the recorder.

    Never raises for what the server does (it becomes a FAILED status with the reason); a client
    bug is also recorded as FAILED. Safe to call from the main thread of a CLI command.
    """
    t0 = time.monotonic()
    run_dir = Path(run_dir)
    load = HostLoad()
    adapter = get_adapter(
        options.engine,
        cell=cell,
        flavor=options.flavor,
        time_scale=options.time_scale,
        cell_ref=options.cell_ref,
        server_cmd=list(options.server_cmd) if options.server_cmd else None,
    )
    handle = None
    argv: list[str] = []
    result: DriveResult
    with _signals_interrupt():
        try:
            if options.base_url is None:

                def launching(cmd: list[str], env: dict[str, str], port: int) -> None:
                    # each start on record before it begins; the last one is the one that ran
                    _meta(recorder, {"engine_launch": EngineLaunch(list(cmd), dict(env), port).to_json()})
                    log.info("starting %s: %s", options.engine, shlex.join(cmd))

                launched_at, t_launch = _utc_now(), time.monotonic()
                handle, argv = start_on_free_port(
                    adapter,
                    cell,
                    run_dir,
                    model=options.model or cell.model,
                    host=options.host,
                    health_timeout=options.health_timeout,
                    extra_args=options.extra_args,
                    port=options.port or None,
                    on_launch=launching,
                )
                start = EngineStart(launched_at, _utc_now(), time.monotonic() - t_launch)
                _meta(recorder, {"engine_start": start.to_json()})
                base_url = handle.base_url
            else:
                base_url = options.base_url.rstrip("/")
            model_name = options.served_model_name or _served_name(adapter, cell)
            _meta(
                recorder,
                {
                    "engine_adapter": {
                        **adapter.describe(),
                        "base_url": base_url,
                        "model_name": model_name,
                        "time_scale": options.time_scale,
                    }
                },
            )
            pin = _pin_speed(adapter, handle, cell, base_url, model_name, options.pin_start)
            if pin is not None:
                _meta(recorder, {"engine_speed_pin": pin})
            checks = asyncio.run(_preflight(adapter, base_url, cell, model_name, options))
            _meta(recorder, {"preflight": checks})
            alive = _liveness(handle)
            group = handle.pid if handle is not None else None
            load.mark("drive_start", group)
            result = asyncio.run(
                drive(
                    client,
                    adapter,
                    base_url,
                    model_name=model_name,
                    time_scale=options.time_scale,
                    request_timeout=options.request_timeout,
                    recorder=recorder,
                    gauge_interval=gauge_interval,
                    duration=duration,
                    server_alive=alive,
                    progress=progress,
                )
            )
            _install_interrupt()
            load.mark("drive_end", group)
            if pin is not None and pin.get("pinned"):
                _meta(
                    recorder,
                    {"engine_speed_pin": {**pin, "after": _recheck_speed(adapter, cell, base_url, model_name, pin)}},
                )
        except SpeedPinError as exc:
            _meta(recorder, {"engine_speed_pin": {"applied": True, **exc.record}})
            result = _failed(RunStatus.FAILED, f"{ENGINE_DID_NOT_START} ({exc.reason}): {exc}{refusal_hint(argv)}", t0)
        except EngineStartError as exc:
            result = _failed(RunStatus.FAILED, f"{ENGINE_DID_NOT_START} ({exc.reason}): {exc}", t0)
        except PreflightError as exc:
            result = _failed(RunStatus.FAILED, f"pre-run check failed: {exc}", t0)
        except (_Interrupted, KeyboardInterrupt) as exc:
            result = _failed(RunStatus.INTERRUPTED, f"interrupted before the drive: {exc or 'KeyboardInterrupt'}", t0)
        finally:
            if handle is not None:
                with contextlib.suppress(Exception):
                    adapter.stop(handle)
    if result.status == RunStatus.FAILED and handle is not None and handle.log_path is not None:
        result.reason += _log_tail_note(handle.log_path)
    _meta(recorder, {"host_load": load.as_meta()})
    _finish(recorder, result)
    return result


def _pin_speed(
    adapter: Any, handle: Any, cell: CellConfig, base_url: str, model_name: str, start: float | None = None
) -> dict[str, Any] | None:
    """Pin the engine's speed to the cell's (harness/servers/speedpin.py) once it is healthy, before
    the smoke checks and the canary; None for a cell without a pin. A server this run did not launch
    under a CPU quota (the emulator, an attached server) cannot be pinned: that is recorded. Raises
    SpeedPinError when the host cannot give the cell's speed, PreflightError when the probe fails."""
    pin = cell.engine_speed_pin
    if pin is None:
        return None
    group = getattr(handle, "cpu_group", None)
    if group is None or cell.engine_cpu_quota is None:
        return {
            "applied": False,
            "reason": "the server was not launched by this run under a CPU quota (emulator or attached server)",
        }
    try:
        first = cell.engine_cpu_quota if start is None else start
        res = pin_blocking(adapter, base_url, pin, first, model_name, lambda q: cpuquota.apply(group, q))
    except SpeedPinError:
        raise
    except Exception as exc:  # a failed probe request or flush is a failed pre-run check, not a crash
        raise PreflightError(f"engine speed pin: {type(exc).__name__}: {exc}") from None
    if handle.log_path is not None:
        with Path(handle.log_path).open("ab") as log:
            log.write(
                f"\n=== agentload: engine speed pinned at {res.quota:.4g} CPU ({res.token_rate:.0f} tokens/s, target "
                f"{res.target:.0f}) after {len(res.steps)} probe(s) in {res.seconds:.1f} s\n".encode()
            )
    return {"applied": True, "start": first, **res.to_json()}


def _recheck_speed(
    adapter: Any, cell: CellConfig, base_url: str, model_name: str, pin: dict[str, Any]
) -> dict[str, Any]:
    """One more probe once the drive is over, at the pinned quota: whether the host gave the engine the
    same speed to the end (on a shared host the speed a quota gives drifts with the others' load).
    Recorded beside the pin, never judged; a failed probe is recorded as such."""
    speed_pin = cell.engine_speed_pin
    if speed_pin is None:  # only a cell with a pin is pinned; nothing to recheck otherwise
        return {"skipped": f"cell {cell.name} has no engine_speed_pin"}
    try:
        step = asyncio.run(recheck(adapter, base_url, speed_pin, model_name, float(pin["quota"])))
    except Exception as exc:  # the run is over: a recheck that fails must not change its status
        return {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(step, str):
        return {"skipped": step}
    return {
        "token_rate": step.token_rate,
        "tokens": step.tokens,
        "seconds": step.seconds,
        "ratio": step.token_rate / float(pin["target"]),
    }


class HostLoad:
    """The host's load averages and the engine's CPU time at the start of a run, when the drive
    starts and when it ends.

    Why: a real engine on a shared CPU node runs as fast as the cores it is left, so a rate
    measured under one load and a test run under another are not comparable; every real run
    records the load it ran under (os.getloadavg: 1, 5, 15 minutes) and the share of a core the
    engine's processes actually got during the drive (their CPU seconds over the wall seconds:
    the server's process group, read from /proc), next to what it measured.
    """

    def __init__(self) -> None:
        self.cpus = os.cpu_count()
        self.marks: dict[str, dict[str, Any]] = {}
        self.mark("start")

    def mark(self, name: str, group: int | None = None) -> None:
        m: dict[str, Any] = {"wall": time.monotonic()}
        with contextlib.suppress(OSError):  # no load averages on this platform
            m["loadavg_1_5_15"] = [round(x, 2) for x in os.getloadavg()]
        if group is not None:
            m["engine_cpu_s"] = group_cpu_seconds(group)
        self.marks[name] = m

    def as_meta(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpus": self.cpus}
        for name, m in self.marks.items():
            if "loadavg_1_5_15" in m:
                out[f"loadavg_{name}"] = m["loadavg_1_5_15"]
        a, b = self.marks.get("drive_start", {}), self.marks.get("drive_end", {})
        if a.get("engine_cpu_s") is not None and b.get("engine_cpu_s") is not None and b["wall"] > a["wall"]:
            cpu = b["engine_cpu_s"] - a["engine_cpu_s"]
            out["engine_cpu_s"] = round(cpu, 3)
            out["engine_cpu_share"] = round(cpu / (b["wall"] - a["wall"]), 4)
        return out


def group_cpu_seconds(pgid: int) -> float | None:
    """User + system CPU seconds of the live processes of process group `pgid` (Linux /proc)."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        names = os.listdir("/proc")
    except (OSError, ValueError, AttributeError):  # pragma: no cover - not Linux
        return None
    total = 0
    for n in names:
        if not n.isdigit():
            continue
        try:
            with open(f"/proc/{n}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 12 and int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


class PreflightError(EngineError):
    """The server is up but unfit for a registered run (smoke failed, cache not emptied)."""


async def _preflight(
    adapter: Any, base_url: str, cell: CellConfig, model_name: str, options: EngineOptions
) -> dict[str, Any]:
    """Stage 0 smoke checks and the flush + canary (cache-off cells: a no-reuse check instead)."""
    out: dict[str, Any] = {}
    async with engine_session() as http:
        if not cell.prefix_cache:
            # Cache-off cells (E0a): the smoke's cache checks and the canary cannot pass by design;
            # the check is instead that a repeated prompt reuses nothing, on an idle engine.
            try:
                out["cache_off"] = await _cache_off_check(adapter, http, base_url, model_name)
            except PreflightError:
                raise
            except Exception as exc:  # a bad reply or a dead server is a failed check, not a crash
                raise PreflightError(f"cache-off check: {type(exc).__name__}: {exc}") from None
            return out
        if options.smoke:
            report = await smoke.run_smoke(adapter, http, base_url, cell=cell, model_name=model_name)
            out["smoke"] = report.to_dict()
            if not report.passed:
                raise PreflightError(f"smoke test: {report.reason}")
        if options.canary:
            result = await smoke.run_canary(adapter, http, base_url, cell=cell, model_name=model_name)
            out["canary"] = result.to_dict()
            if not result.passed:
                raise PreflightError(f"canary: {result.reason}")
    return out


async def _cache_off_check(adapter: Any, http: Any, base_url: str, model_name: str) -> dict[str, Any]:
    """Send one prompt twice; with the prefix cache off the repeat must reuse nothing."""
    import numpy as np

    gauges = await adapter.scrape_metrics(http, base_url)
    busy = {k: gauges[k] for k in ("running", "waiting") if gauges.get(k)}
    if busy:
        raise PreflightError(f"engine not idle before a cache-off run: {busy}")
    prompt = np.random.default_rng(7).integers(4, 32000, size=256, dtype=np.int32)
    first = await adapter.complete(http, base_url, prompt, 4, model_name)
    again = await adapter.complete(http, base_url, prompt, 4, model_name)
    if again.cached_tokens > 0:
        raise PreflightError(
            f"prefix cache is not off: a repeated 256-token prompt reused {again.cached_tokens} tokens"
        )
    return {
        "repeat_cached_tokens": int(again.cached_tokens),
        "first_cached_tokens": int(first.cached_tokens),
        "passed": True,
    }


def _served_name(adapter: Any, cell: CellConfig) -> str:
    fn = getattr(adapter, "served_model_name", None)
    return str(fn(cell)) if callable(fn) else cell.model


def _liveness(handle: Any) -> Any:
    if handle is None or handle.process is None:
        return None
    proc = handle.process

    def alive() -> str | None:
        rc = proc.poll()
        return None if rc is None else f"server process {proc.pid} exited with code {rc}"

    return alive


def _log_tail_note(path: Path, lines: int = 5) -> str:
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return ("; server log tail: " + " | ".join(tail)) if tail else ""


def _meta(recorder: RunRecord | None, values: dict[str, Any]) -> None:
    if recorder is not None:
        recorder.update_meta(values)


def _finish(recorder: RunRecord | None, result: DriveResult) -> None:
    if recorder is None:
        return
    _meta(recorder, {"drive": result.summary(), "flagged": result.flagged})
    recorder.set_status(result.status, result.reason or None)


# ---------------------------------------------------------------------------------------------
# the runner's backend hook
# ---------------------------------------------------------------------------------------------
def engine_options(args: argparse.Namespace, *, cell_ref: str | None = None) -> dict[str, Any]:
    """The `options` dict the runner passes in RunContext.options (from add_engine_arguments)."""
    opts = asdict(options_from_args(args, cell_ref=cell_ref))
    opts["progress_every"] = float(getattr(args, "progress_every", 30.0))
    return opts


def _options_from_ctx(engine: str, options: dict[str, Any]) -> EngineOptions:
    names = {f.name for f in fields(EngineOptions)}
    known = {k: v for k, v in options.items() if k in names}
    known["engine"] = engine
    for k in ("server_cmd", "extra_args"):
        if known.get(k) is not None and not isinstance(known[k], tuple):
            known[k] = tuple(shlex.split(known[k]) if isinstance(known[k], str) else known[k])
    return EngineOptions(**known)


def _cell_ref(bundle: Any) -> str | None:
    """The cell file the emulator should load: the one the test names, resolved like load_test does."""
    name = bundle.test.cell
    ref = name if ("/" in name or name.endswith((".yaml", ".yml"))) else f"cells/{name}"
    try:
        return str(resolve_path(ref, bundle.path.parent if bundle.path else None))
    except ConfigError:
        return None


def real_backend(engine: str) -> Backend:
    """A runner backend (RunContext -> BackendResult) for one real engine kind."""

    def backend(ctx: RunContext) -> BackendResult:
        options = dict(ctx.options)
        if not options.get("cell_ref"):
            options["cell_ref"] = _cell_ref(ctx.bundle)
        opts = _options_from_ctx(engine, options)
        client = ctx.observer.wrap(ctx.client) if ctx.observer is not None else ctx.client
        progress = None
        if ctx.observer is None and ctx.options.get("progress", True):
            progress = RunProgress(
                duration=ctx.duration, title=ctx.run_dir.name, log_every=float(ctx.options.get("progress_every", 30.0))
            )
        try:
            res = run_real(
                client,
                cell=ctx.bundle.cell,
                options=opts,
                run_dir=ctx.run_dir,
                recorder=ctx.recorder,
                duration=ctx.duration,
                gauge_interval=ctx.bundle.protocol.gauge_interval,
                progress=progress,
            )
        finally:
            if progress is not None:
                progress.close()
        meta = {
            "engine": {
                "backend": engine,
                "time_scale": opts.time_scale,
                "base_url": opts.base_url,
                "summary": res.summary(),
            }
        }
        return BackendResult(res.status, res.reason or None, float(res.plan_time), meta)

    return backend


def register_backends() -> None:
    """Make `--engine emulator|vllm|sglang` (and emulator:sglang|vllm) available to the runner."""
    for name in (*REAL_ENGINES, "emulator:sglang", "emulator:vllm"):
        register_backend(name, real_backend(name))


register_backends()
