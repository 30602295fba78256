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

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.servers.base import EngineAdapter
from harness.servers.keepalive import engine_session

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
        return (
            f"cached {self.before} before the flush (need >= {self.min_before}), "
            f"{self.after} after (need <= {self.max_after})"
        )

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
        lines = [
            f"Stage 0 smoke: {self.engine} at {self.base_url}, cell {self.cell}: {'PASS' if self.passed else 'FAIL'}"
        ]
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
            self.http = engine_session()
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
        except Exception as exc:
            res.error = f"{type(exc).__name__}: {exc}"
    return res


async def _check(report: SmokeReport, name: str, coro: Any) -> Check:
    try:
        passed, detail = await coro
        c = Check(name, bool(passed), detail)
    except Exception as exc:
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


async def run_canary(
    adapter: EngineAdapter, base_url: Any, *rest: Any, cell: CellConfig | None = None, **kwargs: Any
) -> CanaryResult:
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
            wrong = {
                k: {"expected": v, "observed": observed[k]}
                for k, v in expected.items()
                if k in observed and observed[k] != v
            }
            unknown = sorted(k for k in expected if k not in observed)
            detail = {
                "launched": launched_argv is not None,
                "verified": len(expected) - len(unknown) - len(wrong),
                "mismatched": len(wrong),
                "unreported": ",".join(unknown) or "-",
                "mismatches": wrong,
            }
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
                "first": first.cached_tokens,
                "repeat": second.cached_tokens,
                "expected": want,
            }

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
            return turn.prompt_tokens == n, {
                "requested": long_prompt,
                "sent": n,
                "limit": limit,
                "capped": n < long_prompt,
                "prompt_tokens": turn.prompt_tokens,
            }

        async def pool() -> tuple[bool, dict[str, Any]]:
            m = await adapter.scrape_metrics(h, base_url)
            got = m.get("pool_tokens")
            return got is not None and int(got) == cell.kv_pool_tokens, {
                "configured": cell.kv_pool_tokens,
                "reported": got,
            }

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
            Check(
                "prompt_length_agreement",
                not mismatches and n_requests > 0,
                {"requests": n_requests, "mismatches": len(mismatches), "examples": mismatches[:5]},
            )
        )
        res = await canary(adapter, base_url, model_name=name, http=h)
        report.canary = res
        report.checks.append(
            Check(
                "flush_empties_cache",
                res.passed,
                {"before": res.before, "after": res.after, "min_before": res.min_before, "max_after": res.max_after},
                res.error,
            )
        )
    report.seconds = time.monotonic() - t0
    return report


def run_smoke_blocking(*args: Any, **kwargs: Any) -> SmokeReport:
    return asyncio.run(run_smoke(*args, **kwargs))


def canary_blocking(*args: Any, **kwargs: Any) -> CanaryResult:
    return asyncio.run(canary(*args, **kwargs))


__all__ = [
    "CANARY_AFTER_MAX",
    "CANARY_TOKENS",
    "CanaryResult",
    "Check",
    "SmokeReport",
    "canary",
    "canary_blocking",
    "expected_cached",
    "run_canary",
    "run_smoke",
    "run_smoke_blocking",
]
