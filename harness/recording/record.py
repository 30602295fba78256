"""Run records: one directory per run, written append-only while the run goes (docs/run-format.md).

Every driver (the simulator, the real-engine driver, the emulator-backed driver) writes through
RunRecorder, and every analysis reads through load_run, so a run is one format whatever produced
it. Rows go to one JSONL file per table as they happen, flushed every FLUSH_ROWS rows and at least
every FLUSH_SECONDS of wall time, so a killed process leaves readable data behind (at worst the
last second and a cut-short final line). close() compacts each table to Parquet, records each
file's SHA-256 in meta.json and then removes the JSONL: the Parquet file is the record.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.json as pj
import pyarrow.parquet as pq

from harness.atomic import write_bytes_atomic, write_with
from harness.errors import RecordError
from harness.recording.schema import (
    COLUMNS,
    FORMAT_VERSION,
    OUTCOMES,
    RESERVED_META,
    RUN_STATUSES,
    TABLES,
    TURN_STATUSES,
    RunStatus,
)

FLUSH_ROWS = 512
FLUSH_SECONDS = 1.0

# The Arrow schemas of the tables, in the column order of the files (harness/recording/schema.py).
SCHEMAS: dict[str, pa.Schema] = {
    name: pa.schema([pa.field(n, pa.type_for_alias(t), nullable=nullable) for n, t, nullable in cols])
    for name, cols in COLUMNS.items()
}
__all__ = [
    "FORMAT_VERSION",
    "OUTCOMES",
    "RESERVED_META",
    "RUN_STATUSES",
    "SCHEMAS",
    "TABLES",
    "TURN_STATUSES",
    "RunFormatError",
    "RunRecorder",
    "RunStatus",
    "load_run",
]


class RunFormatError(RecordError):
    """A run directory cannot be read as a run record."""


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"cannot store {type(obj).__name__} in meta.json")


def dump_meta(meta: Mapping[str, Any]) -> bytes:
    """meta.json's bytes (the one format every writer of a run's meta.json uses)."""
    return orjson.dumps(
        meta, default=_json_default, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class RunRecorder:
    """Writes one run directory. Use as a context manager, or call close() yourself.

    Times are seconds since run start (the driver's clock: virtual in the simulator, monotonic wall
    time on real engines). `meta` is the caller's description of the run (config, plan hash, arm,
    rate, seed, engine, ...); the recorder adds the keys in RESERVED_META and owns them.
    """

    def __init__(self, run_dir: Path | str, meta: Mapping[str, Any]) -> None:
        self.dir = Path(run_dir)
        clash = sorted(set(meta) & set(RESERVED_META))
        if clash:
            raise ValueError(f"meta keys {clash} are set by the recorder; rename them")
        self.dir.mkdir(parents=True, exist_ok=True)
        if (self.dir / "meta.json").exists():
            raise FileExistsError(f"{self.dir} already holds a run (meta.json exists); use a fresh directory")
        self._meta: dict[str, Any] = {
            **meta,
            "format": "agentload-run",
            "format_version": FORMAT_VERSION,
            "status": RunStatus.RUNNING.value,
            "status_reason": None,
            "created_at": _now_iso(),
            "finished_at": None,
            "tables": None,
        }
        self._write_meta()
        # The tables stay open for the run's lifetime and close in close(); the stack hands them over
        # only once all are open, so a failure opening one closes those opened before it.
        with contextlib.ExitStack() as stack:
            self._files: dict[str, BinaryIO] = {
                t: stack.enter_context(open(self.dir / f"{t}.jsonl", "ab")) for t in TABLES
            }
            self._open_files = stack.pop_all()
        self._buf: dict[str, list[bytes]] = {t: [] for t in TABLES}
        self._pending = 0
        self._last_flush = time.monotonic()
        self.closed = False

    # -- rows ------------------------------------------------------------------------------------
    def _row(self, table: str, row: dict[str, Any]) -> None:
        if self.closed:
            raise RuntimeError(f"run record {self.dir} is closed")
        self._buf[table].append(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        self._pending += 1
        if self._pending >= FLUSH_ROWS or time.monotonic() - self._last_flush >= FLUSH_SECONDS:
            self.flush()

    def turn(
        self,
        *,
        session: int,
        kind: str,
        turn: int,
        send_time: float,
        done_time: float | None,
        status: str = "ok",
        first_token_time: float | None = None,
        prompt_tokens: int | None = None,
        cached_tokens: int | None = None,
        completion_tokens: int | None = None,
        n_output_ids: int | None = None,
        queue_time: float | None = None,
        engine_ttft: float | None = None,
        engine_decode: float | None = None,
        http_status: int | None = None,
        error: str | None = None,
        request_id: int | None = None,
    ) -> None:
        """One finished (or failed) request: written when its response is known."""
        if status not in TURN_STATUSES:
            raise ValueError(f"turn status {status!r}; expected one of {TURN_STATUSES}")
        self._row(
            "turns",
            {
                "session": session,
                "kind": kind,
                "turn": turn,
                "request_id": request_id,
                "send_time": send_time,
                "first_token_time": first_token_time,
                "done_time": done_time,
                "prompt_tokens": prompt_tokens,
                "cached_tokens": cached_tokens,
                "completion_tokens": completion_tokens,
                "n_output_ids": n_output_ids,
                "queue_time": queue_time,
                "engine_ttft": engine_ttft,
                "engine_decode": engine_decode,
                "status": status,
                "http_status": http_status,
                "error": error,
            },
        )

    def session(
        self,
        *,
        session: int,
        kind: str,
        arrival: float,
        outcome: str,
        stream: int | None = None,
        index: int | None = None,
        admission: float | None = None,
        end: float | None = None,
        n_turns: int | None = None,
        turns_done: int | None = None,
        start_lateness: float | None = None,
        gate_wait: float | None = None,
        paused_time: float | None = None,
    ) -> None:
        """A session's state. May be written several times (arrival, admission, end): the last wins,
        so a killed run still lists sessions that had arrived, as 'unfinished'."""
        if outcome not in OUTCOMES:
            raise ValueError(f"session outcome {outcome!r}; expected one of {OUTCOMES}")
        self._row(
            "sessions",
            {
                "session": session,
                "kind": kind,
                "stream": stream,
                "index": index,
                "arrival": arrival,
                "admission": admission,
                "end": end,
                "outcome": outcome,
                "n_turns": n_turns,
                "turns_done": turns_done,
                "start_lateness": start_lateness,
                "gate_wait": gate_wait,
                "paused_time": paused_time,
            },
        )

    def gate_event(
        self,
        *,
        time: float,
        event: str,
        session: int | None = None,
        queue_new: int | None = None,
        queue_resume: int | None = None,
        admitted: int | None = None,
        cap: int | None = None,
    ) -> None:
        """A gate decision (engage, admit, pause, resume, release, refuse, ...) with queue lengths after it."""
        self._row(
            "gate_events",
            {
                "time": time,
                "event": event,
                "session": session,
                "queue_new": queue_new,
                "queue_resume": queue_resume,
                "admitted": admitted,
                "cap": cap,
            },
        )

    def gauge(
        self,
        *,
        time: float,
        running: float | None = None,
        waiting: float | None = None,
        kv_used_tokens: float | None = None,
        kv_evictable_tokens: float | None = None,
        pool_tokens: float | None = None,
        prompt_tokens_total: float | None = None,
        cached_tokens_total: float | None = None,
        generation_tokens_total: float | None = None,
        preemptions_total: float | None = None,
    ) -> None:
        """One engine metrics sample; None where the engine does not expose the quantity."""
        self._row(
            "gauges",
            {
                "time": time,
                "running": running,
                "waiting": waiting,
                "kv_used_tokens": kv_used_tokens,
                "kv_evictable_tokens": kv_evictable_tokens,
                "pool_tokens": pool_tokens,
                "prompt_tokens_total": prompt_tokens_total,
                "cached_tokens_total": cached_tokens_total,
                "generation_tokens_total": generation_tokens_total,
                "preemptions_total": preemptions_total,
            },
        )

    def flush(self) -> None:
        """Hand buffered rows to the OS: after this, a killed process loses none of them."""
        for t, buf in self._buf.items():
            if buf:
                f = self._files[t]
                f.write(b"".join(buf))
                f.flush()
                buf.clear()
        self._pending = 0
        self._last_flush = time.monotonic()

    # -- meta and status -------------------------------------------------------------------------
    @property
    def meta(self) -> dict[str, Any]:
        return dict(self._meta)

    def _write_meta(self) -> None:
        write_bytes_atomic(self.dir / "meta.json", dump_meta(self._meta), fsync=True)

    def update_meta(self, values: Mapping[str, Any]) -> None:
        """Add what is learned during the run (engine build, node, smoke results) to meta.json."""
        clash = sorted(set(values) & set(RESERVED_META))
        if clash:
            raise ValueError(f"meta keys {clash} are set by the recorder")
        self._meta.update(values)
        self._write_meta()

    def set_status(self, status: str, reason: str | None = None) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r}; expected one of {RUN_STATUSES}")
        self.flush()
        self._meta["status"] = status
        self._meta["status_reason"] = reason
        self._write_meta()

    # -- end -------------------------------------------------------------------------------------
    def close(self, status: RunStatus | str | None = None, reason: str | None = None) -> None:
        """Compact every table to Parquet, record hashes, and finish the status (COMPLETED if still RUNNING)."""
        if self.closed:
            return
        self.flush()
        self._open_files.close()
        self.closed = True
        tables: dict[str, Any] = {}
        for t in TABLES:
            table, _ = _read_table(self.dir / f"{t}.jsonl", t)
            dst = self.dir / f"{t}.parquet"
            write_with(dst, lambda tmp: pq.write_table(table, tmp, compression="zstd"))  # noqa: B023 - called at once
            tables[t] = {"file": dst.name, "rows": table.num_rows, "sha256": _sha256(dst)}
        if status is not None:
            if status not in RUN_STATUSES:
                raise ValueError(f"run status {status!r}; expected one of {RUN_STATUSES}")
            self._meta["status"], self._meta["status_reason"] = RunStatus(status).value, reason
        elif self._meta["status"] == RunStatus.RUNNING:
            self._meta["status"] = RunStatus.COMPLETED.value
        self._meta["tables"] = tables
        self._meta["finished_at"] = _now_iso()
        self._write_meta()
        for t in TABLES:  # only now: until meta.json names the Parquet files, the JSONL is the record
            (self.dir / f"{t}.jsonl").unlink(missing_ok=True)

    def __enter__(self) -> RunRecorder:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if et is None:
            self.close()
        elif issubclass(et, KeyboardInterrupt):
            self.close(RunStatus.INTERRUPTED, "interrupted (KeyboardInterrupt)")
        else:
            self.close(RunStatus.FAILED, f"{et.__name__}: {ev}")


def _last_per_session(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    last: dict[int, dict[str, Any]] = {}
    for r in rows:
        last.pop(r["session"], None)  # re-insert so the order is that of each session's last row
        last[r["session"]] = r
    return sorted(last.values(), key=lambda r: (r["arrival"], r["session"]))


def _complete_lines(path: Path) -> tuple[bytes, int]:
    """The file's complete lines, and 1 if a final line was cut short (a kill mid-write), else 0.

    A row is complete exactly when its newline was written, so whatever follows the last newline
    is a cut-short row and is dropped.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return b"", 0
    cut = data.rfind(b"\n") + 1
    return data[:cut], int(bool(data[cut:].strip()))


def _read_table(path: Path, table: str) -> tuple[pa.Table, int]:
    """A JSONL table with the table's fixed schema, and the number of cut-short lines dropped."""
    data, dropped = _complete_lines(path)
    schema = SCHEMAS[table]
    if not data.strip():
        return schema.empty_table(), dropped
    if table == "sessions":  # last row per session wins
        return pa.Table.from_pylist(
            _last_per_session([orjson.loads(x) for x in data.splitlines() if x.strip()]), schema=schema
        ), dropped
    try:
        out = pj.read_json(
            pa.BufferReader(data),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="error"),
            read_options=pj.ReadOptions(block_size=1 << 24),
        )
    except pa.ArrowInvalid as exc:
        raise RunFormatError(f"{path}: damaged row ({exc})") from None
    return out.select(schema.names).cast(schema), dropped


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
_PANDAS_TYPES = {pa.int64(): pd.Int64Dtype(), pa.int32(): pd.Int32Dtype(), pa.bool_(): pd.BooleanDtype()}


def _conform(table: pa.Table, schema: pa.Schema, path: Path) -> pa.Table:
    """The table in `schema`'s columns; nullable columns a run recorded before they existed
    (engine_ttft, engine_decode) read as nulls, so older runs stay readable."""
    if table.schema.equals(schema, check_metadata=True):  # as written: nothing to select or cast
        return table
    have = set(table.column_names)
    for f in schema:
        if f.name not in have:
            if not f.nullable:
                raise RunFormatError(f"{path}: missing column {f.name!r}")
            table = table.append_column(f.name, pa.nulls(table.num_rows, f.type))
    return table.select(schema.names).cast(schema)


def _to_frame(table: pa.Table) -> pd.DataFrame:
    frame: pd.DataFrame = table.to_pandas(types_mapper=_PANDAS_TYPES.get)  # pyarrow has no type stubs
    return frame


@dataclass
class RunData:
    """A run as analysis sees it. `partial`: some table was read from JSONL (the run never closed:
    still going, killed or crashed), so the tables may stop short of the run's end."""

    path: Path
    meta: dict[str, Any]
    turns: pd.DataFrame
    sessions: pd.DataFrame
    gate_events: pd.DataFrame
    gauges: pd.DataFrame
    partial: bool
    dropped_lines: int = 0

    @property
    def status(self) -> str:
        return str(self.meta.get("status"))


def load_run(run_dir: Path | str, verify: bool = False, tables: Collection[str] = TABLES) -> RunData:
    """Read a complete or partial run. Same columns and dtypes either way (SCHEMAS).

    Turns gain two derived columns: ttft = first_token_time - send_time and latency = done_time -
    send_time. With verify=True, each Parquet file's SHA-256 is checked against meta.json.

    `tables` names the tables the caller reads (default all): a table left out whose Parquet file
    the run recorded comes back empty (its columns, no rows) without being read; judging a run
    reads no gauges, and reading them cost `analyze` of 18 runs ~0.02 s (issue 24). A table still in
    JSONL is read whatever `tables` says: it makes the run partial, counts in `dropped_lines`, and a
    damaged row refuses the run, as before.
    """
    d = Path(run_dir)
    try:
        meta = orjson.loads((d / "meta.json").read_bytes())
    except FileNotFoundError:
        raise RunFormatError(f"{d}: no meta.json; not a run directory") from None
    except orjson.JSONDecodeError as exc:
        raise RunFormatError(f"{d}/meta.json: not valid JSON ({exc})") from None
    recorded = meta.get("tables") or {}
    frames: dict[str, pd.DataFrame] = {}
    partial = False
    dropped = 0
    for t in TABLES:
        pq_path = d / f"{t}.parquet"
        if pq_path.exists() and t in recorded:
            if verify and _sha256(pq_path) != recorded[t]["sha256"]:
                raise RunFormatError(f"{pq_path}: SHA-256 differs from meta.json; the file changed after the run")
            if t not in tables:
                frames[t] = _to_frame(SCHEMAS[t].empty_table())
                continue
            # ParquetFile.read, not pq.read_table: the same table from one file without the dataset
            # discovery read_table sets up for each (a third of the read time of a run's small files)
            table = _conform(pq.ParquetFile(pq_path).read(), SCHEMAS[t], pq_path)
        else:
            partial = True
            table, n = _read_table(d / f"{t}.jsonl", t)
            dropped += n
        frames[t] = _to_frame(table)
    turns = frames["turns"]
    turns["ttft"] = turns["first_token_time"] - turns["send_time"]
    turns["latency"] = turns["done_time"] - turns["send_time"]
    return RunData(path=d, meta=meta, partial=partial, dropped_lines=dropped, **frames)
