"""The scheduler's accounting of a test's jobs, exported beside its runs and read back.

Why a file: the provenance record (SPEC section 7) must outlive the cluster that ran the jobs, so
`jobs collect` writes the accounting rows once they are final (`<testdir>/provenance/accounting.json`
and `.csv`) and every later reader (status, timeline, verify, the HTML page) reads the file, never
the scheduler. Every timestamp is written twice, in UTC and in the cluster's local zone, so a reader
can match it with either clock.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable
from datetime import UTC, datetime, tzinfo
from pathlib import Path

from harness.atomic import replacing
from slurm.parsers import ACCOUNTING_FIELDS, UNLIMITED, AccountingRow, local_timezone, normalise_state

__all__ = ["EXPORT_COLUMNS", "read_accounting_export", "write_accounting_export"]

EXPORT_COLUMNS: tuple[str, ...] = (
    "job_id",
    "job_name",
    "state",
    "state_raw",
    "exit_code",
    "exit_signal",
    "node_list",
    "timelimit",
    "timelimit_s",
    "elapsed",
    "elapsed_s",
    "comment",
    "submit_utc",
    "start_utc",
    "end_utc",
    "submit_local",
    "start_local",
    "end_local",
)


def _iso(dt: datetime | None) -> str | None:
    return dt.isoformat() if dt is not None else None


def _zone_name(tz: tzinfo) -> str:
    return getattr(tz, "key", None) or str(tz)


def _export_record(row: AccountingRow, tz: tzinfo) -> dict[str, object]:
    rec: dict[str, object] = {
        "job_id": row.job_id,
        "job_name": row.job_name,
        "state": str(row.state),
        "state_raw": row.state_raw,
        "exit_code": row.exit_code,
        "exit_signal": row.exit_signal,
        "node_list": row.node_list,
        "timelimit": row.timelimit,
        # JSON has no infinity: an unlimited job has timelimit "UNLIMITED" and timelimit_s null.
        "timelimit_s": None if row.timelimit_s is None or math.isinf(row.timelimit_s) else row.timelimit_s,
        "elapsed": row.elapsed,
        "elapsed_s": row.elapsed_s,
        "comment": row.comment,
    }
    for name in ("submit", "start", "end"):
        value: datetime | None = getattr(row, name)
        rec[f"{name}_utc"] = _iso(value)
        rec[f"{name}_local"] = _iso(value.astimezone(tz)) if value is not None else None
    return rec


def write_accounting_export(
    rows: Iterable[AccountingRow],
    path: str | os.PathLike[str],
    *,
    fmt: str | None = None,
    local_tz: tzinfo | None = None,
) -> Path:
    """Write accounting rows as CSV or JSON (`fmt`, else from the suffix: `.csv`, `.json`).

    Every timestamp appears twice, ISO 8601 with its offset: `*_utc` (+00:00) and `*_local` in
    `local_tz` (default `local_timezone()`). JSON: {"source", "exported_at_utc", "local_tz",
    "columns", "rows": [...]}; CSV: a header of EXPORT_COLUMNS plus `local_tz`, empty cells for
    missing values. Returns the path.
    """
    out = Path(path)
    kind = (fmt or out.suffix.lstrip(".")).lower()
    if kind not in ("csv", "json"):
        raise ValueError(f"export format must be csv or json, not {kind!r} ({out})")
    tz = local_tz or local_timezone()
    zone = _zone_name(tz)
    records = [_export_record(r, tz) for r in rows]
    with replacing(out) as tmp:
        _write(tmp, kind, records, zone)
    return out


def _write(tmp: Path, kind: str, records: list[dict[str, object]], zone: str) -> None:
    if kind == "json":
        doc = {
            "source": "sacct --parsable2 --noheader -X --format="
            + ",".join(ACCOUNTING_FIELDS)
            + " (SLURM_TIME_FORMAT=%s)",
            "exported_at_utc": datetime.now(UTC).isoformat(),
            "local_tz": zone,
            "columns": list(EXPORT_COLUMNS),
            "rows": records,
        }
        tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    else:
        with tmp.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=[*EXPORT_COLUMNS, "local_tz"])
            writer.writeheader()
            for rec in records:
                writer.writerow({k: ("" if v is None else v) for k, v in {**rec, "local_tz": zone}.items()})


def read_accounting_export(path: str | os.PathLike[str]) -> list[AccountingRow]:
    """Rows back from a file `write_accounting_export` wrote (CSV or JSON, by suffix)."""
    src = Path(path)
    if src.suffix.lower() == ".json":
        records: list[dict[str, object]] = json.loads(src.read_text(encoding="utf-8"))["rows"]
    else:
        with src.open(newline="", encoding="utf-8") as fh:
            records = [{k: (None if v == "" else v) for k, v in rec.items()} for rec in csv.DictReader(fh)]
    return [_row_from_record(rec) for rec in records]


def _row_from_record(rec: dict[str, object]) -> AccountingRow:
    """One exported record (JSON values, or CSV cells with empty read as None) as a row again."""

    def ts(name: str) -> datetime | None:
        v = rec.get(f"{name}_utc")
        return datetime.fromisoformat(str(v)).astimezone(UTC) if v else None

    def num(name: str) -> float | None:
        v = rec.get(name)
        return float(str(v)) if v is not None else None

    def opt_int(name: str) -> int | None:
        v = rec.get(name)
        return int(str(v)) if v is not None else None

    timelimit = str(rec.get("timelimit") or "")
    return AccountingRow(
        job_id=str(rec["job_id"]),
        job_name=str(rec.get("job_name") or ""),
        submit=ts("submit"),
        start=ts("start"),
        end=ts("end"),
        state=normalise_state(str(rec["state"])),
        state_raw=str(rec.get("state_raw") or rec["state"]),
        exit_code=opt_int("exit_code"),
        exit_signal=opt_int("exit_signal"),
        node_list=str(rec.get("node_list") or ""),
        timelimit=timelimit,
        timelimit_s=math.inf if timelimit.upper() in UNLIMITED else num("timelimit_s"),
        elapsed=str(rec.get("elapsed") or ""),
        elapsed_s=num("elapsed_s"),
        comment=str(rec.get("comment") or ""),
    )
