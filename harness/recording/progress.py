"""Live progress of a long run: plan time, sessions in system, recent hit fraction, errors.

Why: a registered run lasts 2.4 hours of plan time and a trapped one looks healthy for its first
twenty minutes; the person watching needs the few numbers that tell a trap from a warm-up (the
backlog and the hit fraction of the last minute) without opening the records. On a terminal it is a
rich live panel; anywhere else (SLURM logs, CI) it degrades to one plain log line every
`log_every` wall seconds, so job logs stay small and greppable.

Usage, by any driver (the asyncio driver calls these itself; the simulator's main loop may too):

    with RunProgress(duration=8700, title="E2 BURST seed 0") as prog:
        ...
        prog.on_turn(t, prompt_tokens, cached_tokens, status)   # every completed turn
        prog.update(t, in_system=n, in_flight=k, held=h, errors=e)  # as often as convenient
        prog.on_gauges(t, {"running": .., "waiting": .., "kv_usage_frac": ..})  # optional

`t` is plan time (seconds since run start); rendering is throttled on the wall clock, so calling
update() on every simulator event costs one comparison. A turn "hits" when more than half of its
prompt was served from cache (the paper's definition).

`TestDisplay` is the same idea one level up: one row per run of a whole test (plan time, backlog,
recent hits, status), fed by the test runner's worker messages.
"""

from __future__ import annotations

import collections
import logging
import sys
import time
from collections.abc import Sequence
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from harness.recording.schema import HIT_THRESHOLD, RunStatus, is_hit

log = logging.getLogger("agentload.progress")

HIT_WINDOW = 60.0  # plan seconds behind the recent hit fraction


class RunProgress:
    """A progress display; see the module docstring for the calls a driver makes."""

    def __init__(
        self,
        *,
        duration: float | None = None,
        title: str = "run",
        log_every: float = 30.0,
        live: bool | None = None,
        stream: IO[str] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.duration = duration
        self.title = title
        self.log_every = float(log_every)
        self.stream = stream if stream is not None else sys.stdout
        self.logger = logger
        self.live = self.stream.isatty() if live is None else live
        self._recent: collections.deque[tuple[float, bool]] = collections.deque()
        self._turns = 0
        self._ok = 0
        self._errors = 0
        self._hits = 0
        self._t = 0.0
        self._state: dict[str, Any] = {}
        self._gauges: dict[str, float] = {}
        self._last_emit = float("-inf")
        self._wall0 = time.monotonic()
        self._live_obj: Any = None

    # ------------------------------------------------------------------ feeding
    def on_turn(self, t: float, prompt_tokens: int | None, cached_tokens: int | None, status: str) -> None:
        self._turns += 1
        if status != "ok":
            self._errors += 1
            return
        self._ok += 1
        hit = is_hit(cached_tokens, prompt_tokens, HIT_THRESHOLD)
        self._hits += hit
        self._recent.append((t, hit))

    def on_gauges(self, t: float, values: dict[str, float]) -> None:
        self._gauges = dict(values)

    def update(
        self,
        t: float,
        *,
        in_system: int | None = None,
        in_flight: int | None = None,
        held: int | None = None,
        errors: int | None = None,
        final: bool = False,
    ) -> None:
        self._t = max(self._t, t)
        self._state = {"in_system": in_system, "in_flight": in_flight, "held": held}
        if errors is not None:
            self._errors = max(self._errors, errors)
        now = time.monotonic()
        if self.live:
            if final or now - self._last_emit >= 0.25:
                self._last_emit = now
                self._render_live(final)
        elif final or now - self._last_emit >= self.log_every:
            self._last_emit = now
            self._emit_line()

    # ------------------------------------------------------------------ numbers
    def recent_hit_fraction(self) -> float | None:
        """Hit fraction of the ok turns completed in the last HIT_WINDOW plan seconds."""
        while self._recent and self._recent[0][0] < self._t - HIT_WINDOW:
            self._recent.popleft()
        if not self._recent:
            return None
        return sum(h for _, h in self._recent) / len(self._recent)

    def snapshot(self) -> dict[str, Any]:
        hf = self.recent_hit_fraction()
        outstanding = None
        if self._state.get("in_flight") is not None:
            outstanding = (self._state["in_flight"] or 0) + (self._state.get("held") or 0)
        return {
            "plan_time": self._t,
            "duration": self.duration,
            "in_system": self._state.get("in_system"),
            "in_flight": self._state.get("in_flight"),
            "held": self._state.get("held"),
            "outstanding": outstanding,
            "turns": self._turns,
            "errors": self._errors,
            "hit_fraction_1min": hf,
            "running": self._gauges.get("running"),
            "waiting": self._gauges.get("waiting"),
            "kv_usage_frac": self._gauges.get("kv_usage_frac"),
            "wall": time.monotonic() - self._wall0,
        }

    def line(self) -> str:
        s = self.snapshot()

        def f(v: Any, fmt: str = "{}") -> str:
            return "-" if v is None else fmt.format(v)

        horizon = f"/{self.duration:.0f}" if self.duration else ""
        return (
            f"[{self.title}] t={s['plan_time']:.0f}{horizon}s in_system={f(s['in_system'])} "
            f"in_flight={f(s['in_flight'])} held={f(s['held'])} outstanding={f(s['outstanding'])} "
            f"hit_1min={f(s['hit_fraction_1min'], '{:.3f}')} turns={s['turns']} errors={s['errors']} "
            f"engine_running={f(s['running'], '{:.0f}')} engine_waiting={f(s['waiting'], '{:.0f}')} "
            f"kv={f(s['kv_usage_frac'], '{:.2f}')} wall={s['wall']:.0f}s"
        )

    # ------------------------------------------------------------------ output
    def _emit_line(self) -> None:
        text = self.line()
        if self.logger is not None:
            self.logger.info(text)
        else:
            print(text, file=self.stream, flush=True)

    def _table(self) -> Any:
        s = self.snapshot()
        t = Table(title=self.title, show_header=False, expand=False)
        t.add_column("what", style="bold")
        t.add_column("value", justify="right")
        pct = f"  ({100 * s['plan_time'] / self.duration:.0f}%)" if self.duration else ""
        t.add_row("plan time", f"{s['plan_time']:.0f} s{pct}")

        def value_row(label: str, key: str, fmt: str) -> None:
            v = s[key]
            t.add_row(label, "-" if v is None else fmt.format(v))

        for label, key, fmt in (
            ("sessions in system", "in_system", "{}"),
            ("requests in flight", "in_flight", "{}"),
            ("held at the gate", "held", "{}"),
            ("outstanding", "outstanding", "{}"),
            ("hit fraction, last minute", "hit_fraction_1min", "{:.3f}"),
            ("turns done", "turns", "{}"),
            ("errors", "errors", "{}"),
        ):
            value_row(label, key, fmt)
        r, w = s["running"], s["waiting"]
        t.add_row("engine running / waiting", "-" if r is None else f"{r:.0f} / {w if w is None else int(w)}")
        value_row("KV usage", "kv_usage_frac", "{:.2f}")
        return t

    def _render_live(self, final: bool) -> None:
        if self._live_obj is None:
            self._live_obj = Live(self._table(), console=Console(file=self.stream), auto_refresh=False, transient=False)
            self._live_obj.start()
        self._live_obj.update(self._table(), refresh=True)
        if final:
            self.close()

    def close(self) -> None:
        if self._live_obj is not None:
            self._live_obj.stop()
            self._live_obj = None

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.live:
            self._emit_line()
        self.close()


# ---------------------------------------------------------------------------------------------
class TestDisplay:
    """Per-run plan time, backlog and recent hit fraction; rich on a TTY, log lines elsewhere."""

    __test__ = False

    def __init__(self, stream: Any = None, live: bool | None = None, log_every: float = 15.0) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty() if live is None else live
        self.log_every = log_every
        self.rows: dict[str, dict[str, Any]] = {}
        self.duration = 1.0
        self._live: Any = None
        self._last = 0.0
        self._t0 = time.monotonic()

    def start(self, keys: Sequence[str], duration: float) -> None:
        self.duration = duration
        self.rows = {k: {"t": 0.0, "in_system": None, "hit": None, "status": "queued"} for k in keys}
        self._t0 = time.monotonic()
        if self.live:
            self._live = Live(self._table(), console=Console(file=self.stream), refresh_per_second=4, transient=False)
            self._live.start()
        else:
            self._print(f"running {len(keys)} runs of {duration:.0f} s plan time each")

    def update(self, msg: dict[str, Any]) -> None:
        row = self.rows.setdefault(msg["key"], {})
        row.update({"t": msg["t"], "in_system": msg.get("in_system"), "held": msg.get("held"), "status": "running"})
        if msg.get("hit") is not None:
            row["hit"] = msg["hit"]
        self._refresh()

    def finished(self, key: str, res: Any) -> None:
        row = self.rows.setdefault(key, {})
        row.update(
            {
                "status": res.status,
                "t": res.plan_time if res.plan_time == res.plan_time else row.get("t", 0.0),
                "wall": res.wall_s,
            }
        )
        if not self.live:
            reason = (res.reason or "").strip()
            extra = f" ({reason.splitlines()[0]})" if res.status != RunStatus.COMPLETED and reason else ""
            warn = "".join(f"; warning: {w}" for w in getattr(res, "warnings", None) or ())
            self._print(f"{key}: {res.status} in {res.wall_s:.0f} s{extra}{warn}")
        self._refresh(force=True)

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self._table(), refresh=True)
            self._live.stop()
            self._live = None
        else:
            self._print(self._summary())

    def _summary(self) -> str:
        done = sum(
            1
            for r in self.rows.values()
            if r.get("status") in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.INTERRUPTED)
        )
        frac = sum(min(r.get("t", 0.0), self.duration) for r in self.rows.values()) / (
            self.duration * max(1, len(self.rows))
        )
        return (
            f"[{time.monotonic() - self._t0:.0f} s] {done}/{len(self.rows)} runs done, {100 * frac:.0f}% of plan time"
        )

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._live is not None:
            self._live.update(self._table())
        elif force or now - self._last >= self.log_every:
            self._last = now
            if not force:
                self._print(self._summary())

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def _table(self) -> Any:
        t = Table(title=self._summary(), expand=False)
        for col, j in (
            ("run", "left"),
            ("plan time", "right"),
            ("in system", "right"),
            ("held", "right"),
            ("hit (last 50 s)", "right"),
            ("status", "left"),
        ):
            t.add_column(col, justify=j)  # type: ignore[arg-type]
        for k, r in self.rows.items():
            pct = 100 * min(r.get("t", 0.0), self.duration) / self.duration
            hit = r.get("hit")
            t.add_row(
                k,
                f"{r.get('t', 0.0):.0f} s ({pct:.0f}%)",
                "-" if r.get("in_system") is None else str(r["in_system"]),
                "-" if not r.get("held") else str(r["held"]),
                "-" if hit is None else f"{hit:.2f}",
                str(r.get("status", "")),
            )
        return t
