"""Stage 0 smoke test and the per-run canary.

Why both: the smoke test proves once per cell that the engine is configured as the cell says
and reports what the harness reads (cached tokens, output ids, prompt lengths, the pool); the
canary proves before every run that the flush really emptied the prefix cache, since a run that
starts with a warm cache is not the run that was registered. A run must not start if either fails.

Canary rule (the registered threshold): a 1024-token request sent twice must reuse at least
1024 - block - 1 tokens before the flush and at most 15 after it. A working cache reuses the whole
prompt minus its recomputed last token, rounded down to blocks (1023 on SGLang, 1008 with vLLM's
16-token blocks, 992 with 32); the threshold sits at most one block below that.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.config import SpeedPin
from harness.servers import cpuquota
from harness.servers.base import EngineAdapter
from harness.servers.speedpin import measure_blocking

if TYPE_CHECKING:
    import aiohttp

    from harness.config import CellConfig

CANARY_TOKENS = 1024
CANARY_AFTER_MAX = 15
WORKLOAD_MAX_PROMPT = 40_350  # L0 + 59 (Delta + d): the longest prompt of the workload of record
_CANARY_SEED = 0x43414E41  # a token stream no client session uses


def expected_cached(prompt_len: int, block_size: int) -> int:
    """Tokens a full-prefix hit reuses: all but the last prompt token, rounded down to blocks."""
    return ((prompt_len - 1) // block_size) * block_size


def canary_prompt(n: int = CANARY_TOKENS, seed: int = _CANARY_SEED) -> np.ndarray:
    return np.random.default_rng(seed).integers(4, 32000, size=n, dtype=np.int32)


@dataclass
class CanaryResult:
    before: int  # cached tokens of the repeat before the flush
    after: int  # cached tokens of the repeat after the flush
    block_size: int
    min_before: int
    max_after: int = CANARY_AFTER_MAX
    prompt_tokens: int = CANARY_TOKENS
    flush_seconds: float = 0.0
    error: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.before >= self.min_before and self.after <= self.max_after

    @property
    def reason(self) -> str:
        if self.error:
            return self.error
        return f"cached {self.before} before the flush (need >= {self.min_before}), {self.after} after (need <= {self.max_after})"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed, "reason": self.reason}


@dataclass
class Check:
    name: str
    passed: bool
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class SmokeReport:
    engine: str
    base_url: str
    cell: str
    checks: list[Check] = field(default_factory=list)
    canary: CanaryResult | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def reason(self) -> str:
        failed = [c for c in self.checks if not c.passed]
        if not failed:
            return "all checks passed"
        return "; ".join(f"{c.name} failed" + (f" ({c.error})" if c.error else f" {_short(c.detail)}") for c in failed)

    def check(self, name: str) -> Check:
        return next(c for c in self.checks if c.name == name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "base_url": self.base_url,
            "cell": self.cell,
            "passed": self.passed,
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "checks": [asdict(c) for c in self.checks],
            "canary": self.canary.to_dict() if self.canary else None,
        }

    def summary(self) -> str:
        lines = [f"Stage 0 smoke: {self.engine} at {self.base_url}, cell {self.cell}: {'PASS' if self.passed else 'FAIL'}"]
        for c in self.checks:
            info = ", ".join(f"{k}={v}" for k, v in c.detail.items() if not isinstance(v, (dict, list)))
            lines.append(f"  [{'ok' if c.passed else 'FAIL'}] {c.name}: {info}" + (f" ({c.error})" if c.error else ""))
        return "\n".join(lines)


def _short(detail: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in detail.items() if not isinstance(v, (dict, list))) + "}"


class _Session:
    """An aiohttp session owned by the call when the caller passed none."""

    def __init__(self, http: aiohttp.ClientSession | None) -> None:
        self.http = http
        self.own = http is None

    async def __aenter__(self) -> aiohttp.ClientSession:
        if self.http is None:
            import aiohttp

            self.http = aiohttp.ClientSession()
        return self.http

    async def __aexit__(self, *exc: object) -> None:
        if self.own and self.http is not None:
            await self.http.close()


async def canary(
    adapter: EngineAdapter,
    base_url: str,
    *,
    model_name: str,
    http: aiohttp.ClientSession | None = None,
    block_size: int | None = None,
    flush_timeout: float = 120.0,
    leave_empty: bool = True,
) -> CanaryResult:
    """Prime, repeat (must hit), flush, repeat (must miss), and flush again if `leave_empty`.

    The final flush keeps the canary's own blocks out of the run's pool; the flush has just been
    shown to work, so it needs no second proof.
    """
    bs = block_size or adapter.block_size
    res = CanaryResult(before=-1, after=-1, block_size=bs, min_before=CANARY_TOKENS - bs - 1)
    prompt = canary_prompt()
    async with _Session(http) as h:
        try:
            await adapter.complete(h, base_url, prompt, 1, model_name)
            res.before = (await adapter.complete(h, base_url, prompt, 1, model_name)).cached_tokens
            t0 = time.monotonic()
            await adapter.flush_cache(h, base_url, timeout=flush_timeout)
            res.flush_seconds = round(time.monotonic() - t0, 3)
            res.after = (await adapter.complete(h, base_url, prompt, 1, model_name)).cached_tokens
            if leave_empty:
                await adapter.flush_cache(h, base_url, timeout=flush_timeout)
        except Exception as exc:  # noqa: BLE001 - every failure is a failed canary, with its reason
            res.error = f"{type(exc).__name__}: {exc}"
    return res


async def _check(report: SmokeReport, name: str, coro: Any) -> Check:
    try:
        passed, detail = await coro
        c = Check(name, bool(passed), detail)
    except Exception as exc:  # noqa: BLE001 - a crashing check is a failed check
        c = Check(name, False, {}, f"{type(exc).__name__}: {exc}")
    report.checks.append(c)
    return c


def _http_first(base_url: Any, rest: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, tuple[Any, ...]]:
    """Accept (adapter, http, base_url, ...) as well as (adapter, base_url, ...).

    The asyncio driver's call sites hold a session first; both orders are unambiguous because a
    base URL is a str and a session is not.
    """
    if isinstance(base_url, str):
        return base_url, rest
    if not rest:
        raise TypeError("base_url is required")
    kwargs.setdefault("http", base_url)
    return rest[0], rest[1:]


async def run_smoke(adapter: EngineAdapter, base_url: Any, *rest: Any, **kwargs: Any) -> SmokeReport:
    """run_smoke(adapter, base_url, cell, *, http=None, model_name=None, ...) -> SmokeReport.

    Also callable as run_smoke(adapter, http, base_url, cell=cell, ...).
    """
    url, rest = _http_first(base_url, rest, kwargs)
    return await _run_smoke(adapter, url, *rest, **kwargs)


async def run_canary(adapter: EngineAdapter, base_url: Any, *rest: Any, cell: CellConfig | None = None, **kwargs: Any) -> CanaryResult:
    """The canary under the driver's calling convention; `cell` only fixes the block size."""
    url, rest = _http_first(base_url, rest, kwargs)
    if cell is not None:
        kwargs.setdefault("block_size", cell.page_size)
    return await canary(adapter, url, *rest, **kwargs)


async def _run_smoke(
    adapter: EngineAdapter,
    base_url: str,
    cell: CellConfig,
    *,
    http: aiohttp.ClientSession | None = None,
    model_name: str | None = None,
    long_prompt: int = WORKLOAD_MAX_PROMPT,
    decode_tokens: int = 100,
    launched_argv: list[str] | None = None,
    seed: int = 0,
) -> SmokeReport:
    """Every Stage 0 check, each recorded with its numbers; the canary is the last check.

    The long-context check sends min(long_prompt, the longest prompt the engine accepts with one
    output token) and says so (`capped`) when the engine's limit is the smaller: a tiny CPU test
    server cannot hold 40k. That limit is the adapter's (vLLM: context - 1; SGLang: min(context,
    pool) - 7, because its scheduler keeps a margin below the context).
    """
    t0 = time.monotonic()
    name = model_name or cell.model
    report = SmokeReport(engine=adapter.name, base_url=base_url, cell=cell.name)
    bs = adapter.block_size
    rng = np.random.default_rng(seed)
    mismatches: list[dict[str, int]] = []
    n_requests = 0

    async with _Session(http) as h:

        async def send(prompt: np.ndarray, max_tokens: int) -> Any:
            nonlocal n_requests
            turn = await adapter.complete(h, base_url, prompt, max_tokens, name)
            n_requests += 1
            server_len = turn.extra.get("server_prompt_len", turn.prompt_tokens)
            if turn.prompt_tokens != len(prompt) or server_len != len(prompt):
                mismatches.append({"sent": len(prompt), "usage": turn.prompt_tokens or -1, "echoed": server_len or -1})
            return turn

        async def flags() -> tuple[bool, dict[str, Any]]:
            expected = adapter.expected_settings(cell)
            observed = await adapter.server_settings(h, base_url)
            wrong = {k: {"expected": v, "observed": observed[k]} for k, v in expected.items() if k in observed and observed[k] != v}
            unknown = sorted(k for k in expected if k not in observed)
            detail = {"launched": launched_argv is not None, "verified": len(expected) - len(unknown) - len(wrong), "mismatched": len(wrong), "unreported": ",".join(unknown) or "-", "mismatches": wrong}
            if launched_argv is not None:
                detail["argv"] = launched_argv
            return not wrong, detail

        async def output_ids() -> tuple[bool, dict[str, Any]]:
            turn = await send(rng.integers(4, 32000, 200, dtype=np.int32), decode_tokens)
            n = len(turn.output_ids)
            ok = n == decode_tokens and turn.completion_tokens in (None, decode_tokens)
            return ok, {"requested": decode_tokens, "returned_ids": n, "completion_tokens": turn.completion_tokens}

        async def cached_reported() -> tuple[bool, dict[str, Any]]:
            p = rng.integers(4, 32000, 64, dtype=np.int32)
            first = await send(p, 1)
            second = await send(p, 1)
            want = expected_cached(64, bs)
            return second.cached_tokens == want and first.cached_tokens == 0, {
                "first": first.cached_tokens, "repeat": second.cached_tokens, "expected": want,
            }  # fmt: skip

        async def follow_up_hit() -> tuple[bool, dict[str, Any]]:
            p = rng.integers(4, 32000, 500, dtype=np.int32)
            first = await send(p, 16)
            p2 = np.concatenate([p, first.output_ids, rng.integers(4, 32000, 64, dtype=np.int32)])
            second = await send(p2, 16)
            want = expected_cached(len(p) + len(first.output_ids), bs)
            return second.cached_tokens == want, {"prompt": len(p2), "cached": second.cached_tokens, "expected": want}

        async def long_context() -> tuple[bool, dict[str, Any]]:
            limit = adapter.max_prompt_tokens(cell, 1)
            n = min(long_prompt, limit)
            turn = await send(rng.integers(4, 32000, n, dtype=np.int32), 1)
            return turn.prompt_tokens == n, {"requested": long_prompt, "sent": n, "limit": limit, "capped": n < long_prompt, "prompt_tokens": turn.prompt_tokens}

        async def pool() -> tuple[bool, dict[str, Any]]:
            m = await adapter.scrape_metrics(h, base_url)
            got = m.get("pool_tokens")
            return got is not None and int(got) == cell.kv_pool_tokens, {"configured": cell.kv_pool_tokens, "reported": got}

        async def gauges() -> tuple[bool, dict[str, Any]]:
            m = await adapter.scrape_metrics(h, base_url)
            need = ("running", "waiting", "kv_usage_frac", "prompt_tokens_total", "cached_tokens_total")
            missing = [k for k in need if k not in m]
            return not missing, {"names": len(m), "missing": ",".join(missing) or "-", "values": m}

        await _check(report, "flags_accepted", flags())
        await _check(report, "output_ids_returned", output_ids())
        await _check(report, "cached_tokens_reported", cached_reported())
        await _check(report, "follow_up_hits_blocks", follow_up_hit())
        await _check(report, "long_context_accepted", long_context())
        await _check(report, "pool_size", pool())
        await _check(report, "gauges_scraped", gauges())
        report.checks.append(
            Check("prompt_length_agreement", not mismatches and n_requests > 0, {"requests": n_requests, "mismatches": len(mismatches), "examples": mismatches[:5]})
        )
        res = await canary(adapter, base_url, model_name=name, http=h)
        report.canary = res
        report.checks.append(Check("flush_empties_cache", res.passed, {"before": res.before, "after": res.after, "min_before": res.min_before, "max_after": res.max_after}, res.error))
    report.seconds = time.monotonic() - t0
    return report


def run_smoke_blocking(*args: Any, **kwargs: Any) -> SmokeReport:
    return asyncio.run(run_smoke(*args, **kwargs))


def canary_blocking(*args: Any, **kwargs: Any) -> CanaryResult:
    return asyncio.run(canary(*args, **kwargs))


# ---------------------------------------------------------------------------------------------
# `agentload smoke`
# ---------------------------------------------------------------------------------------------
def register(cli: Any) -> None:
    p = cli.command("smoke", group="execute", help="Stage 0: check an engine server against a cell (flags, cache reporting, pool, flush)")
    p.add_argument("--engine", required=True, help="sglang | vllm | emulator (emulator:sglang, emulator:vllm)")
    p.add_argument("--cell", required=True, help="cell config (path or name under configs/cells)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--server-cmd", help="launcher prefix to which the cell's flags are appended, e.g. '/opt/vllm/bin/python -m vllm.entrypoints.openai.api_server'")
    src.add_argument("--base-url", help="check an already running server instead of launching one")
    p.add_argument("--model-path", "--model", dest="model", help="weights the engine loads (default: the cell's model)")
    p.add_argument("--flavor", choices=("sglang", "vllm"), help="emulator dialect (default: the cell's engine)")
    p.add_argument("--time-scale", type=float, default=1.0, help="emulator time scale")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = a free port")
    p.add_argument("--engine-arg", "--server-arg", dest="engine_arg", action="append", default=[], metavar="ARG",
                   help="extra server argument(s), shell-split (repeatable): --engine-arg='--dtype bfloat16'")
    p.add_argument("--run-dir", type=Path, default=None, help="where the server log and smoke.json go (default results/smoke/smoke-<time>)")
    p.add_argument("--health-timeout", type=float, default=900.0)
    p.add_argument("--long-prompt", type=int, default=WORKLOAD_MAX_PROMPT)
    p.add_argument("--decode-tokens", type=int, default=100)
    p.add_argument("--cache-dir", type=Path, default=None, help="private folder for the engine's compile caches and temp files")
    p.add_argument("--probe-quotas", default=None, metavar="Q1,Q2,...",
                   help="after the checks, the speed pin's probe (the cell's engine_speed_pin shape, else the default) at each CPU "
                        "quota: what a cell's engine_speed_pin.token_rate is measured with (needs a cell with engine_cpu_quota)")
    p.add_argument("--probe-repeats", type=int, default=3, help="probes per quota (default 3)")
    p.set_defaults(func=_cmd_smoke)
    from harness.servers.base import EngineStartError

    cli.user_errors(EngineStartError)


def _cmd_smoke(args: argparse.Namespace) -> int:
    from harness.config import CellConfig, load_config
    from harness.servers import free_port, get_adapter
    from harness.servers.vllm import private_cache_env

    cell = load_config(args.cell, CellConfig)
    adapter = get_adapter(args.engine, cell=cell, flavor=args.flavor, time_scale=args.time_scale, cell_ref=args.cell,
                          server_cmd=shlex.split(args.server_cmd) if args.server_cmd else None)  # fmt: skip
    run_dir = args.run_dir or Path("results") / "smoke" / time.strftime("smoke-%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = None
    argv: list[str] | None = None
    base_url = args.base_url
    try:
        if base_url is None:
            port = args.port or free_port(args.host)
            extra = [tok for a in args.engine_arg for tok in shlex.split(a)]
            argv, env = adapter.launch_command(cell, model=args.model or cell.model, host=args.host, port=port, extra_args=extra)
            if args.cache_dir is not None:
                env.update(private_cache_env(args.cache_dir))
            t0 = time.monotonic()
            handle = adapter.start(argv, env, run_dir, host=args.host, port=port, health_timeout=args.health_timeout)
            print(f"server healthy after {time.monotonic() - t0:.1f} s at {handle.base_url} (log {handle.log_path})")
            base_url = handle.base_url
        report = run_smoke_blocking(adapter, base_url.rstrip("/"), cell, model_name=adapter.served_model_name(cell),
                                    long_prompt=args.long_prompt, decode_tokens=args.decode_tokens, launched_argv=argv)  # fmt: skip
        if args.probe_quotas:
            _probe_quotas(adapter, handle, cell, base_url.rstrip("/"), [float(x) for x in args.probe_quotas.split(",")], args.probe_repeats, run_dir)
    finally:
        if handle is not None:
            adapter.stop(handle)
    (run_dir / "smoke.json").write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    print(report.summary())
    print(f"report: {run_dir / 'smoke.json'}")
    return 0 if report.passed else 1


def _probe_quotas(adapter: EngineAdapter, handle: Any, cell: CellConfig, base_url: str, quotas: list[float], repeats: int, run_dir: Path) -> None:
    """The speed pin's probe at each quota (harness/servers/speedpin.py), printed and kept in probe.json."""
    group = getattr(handle, "cpu_group", None)
    if group is None:
        raise SystemExit("smoke --probe-quotas: the server must be launched here under a CPU quota (a cell with engine_cpu_quota)")
    pin = cell.engine_speed_pin or SpeedPin(token_rate=1.0, max_cpu_quota=max(quotas), source="measurement")
    steps = measure_blocking(adapter, base_url, pin, adapter.served_model_name(cell), quotas, repeats, lambda q: cpuquota.apply(group, q))
    print(f"speed probe ({pin.requests} prompts x {pin.prompt_tokens} tokens, {pin.max_tokens} out, at once):")
    for q in quotas:
        rates = [s.token_rate for s in steps if abs(s.quota - q) < 1e-6]
        print(f"  quota {q:g} CPU: {np.mean(rates):.0f} uncached tokens/s (runs {', '.join(f'{r:.0f}' for r in rates)})")
    (run_dir / "probe.json").write_text(json.dumps([s.__dict__ for s in steps], indent=2) + "\n")


__all__ = [
    "CANARY_AFTER_MAX",
    "CANARY_TOKENS",
    "CanaryResult",
    "Check",
    "SmokeReport",
    "canary",
    "canary_blocking",
    "expected_cached",
    "register",
    "run_canary",
    "run_smoke",
    "run_smoke_blocking",
]
