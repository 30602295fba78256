"""What a run record holds, independent of how it is stored: table columns, run and turn statuses,
and what counts as a hit (docs/run-format.md).

This is the bottom of the data flow: the recorder writes it, the judge reads it, the progress display
counts by it. It imports nothing heavy (the Parquet types are built from these tuples by
harness/recording/record.py), so the enum and the hit predicate cost nothing to import.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any

import orjson

FORMAT_VERSION = 1


# Where a test directory keeps the run of a job that was submitted again because its run never
# started (slurm/resubmit.py): beside runs/, never counted, never scored; kept as the record of it.
SUPERSEDED_DIR = "superseded"


def meta_files_under(folder: Path) -> list[Path]:
    """Every run's meta.json under `folder`, leaving out a superseded run's (SUPERSEDED_DIR): what
    each finder of a test's runs searches (scoring, the registered analysis, replay), each adding
    its own exclusions."""
    return [m for m in folder.rglob("meta.json") if SUPERSEDED_DIR not in m.relative_to(folder).parts]


class RunStatus(StrEnum):
    """A run's status in meta.json (`status`). The values are the on-disk strings."""

    RUNNING = "RUNNING"  # being written (or killed before close: load_run reads it as partial)
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"  # the engine died, or the driver could not go on
    INTERRUPTED = "INTERRUPTED"  # SIGTERM / SIGINT (a scheduler's time limit): records kept
    REFUSED = "REFUSED"  # a job's checks stopped it before any run


RUN_STATUSES = tuple(s.value for s in RunStatus)
TURN_STATUSES = ("ok", "error", "timeout", "unfinished")  # unfinished: still in flight when the run ended
OUTCOMES = ("completed", "refused", "unfinished", "failed")
RESERVED_META = ("format", "format_version", "status", "status_reason", "created_at", "finished_at", "tables")

#: The paper's definition of a hit (SPEC §1): a turn hits when more than half of its prompt was served
#: from the prefix cache. A registered verdict reads its threshold from the rule spec (`hit_threshold`);
#: this value is for what no rule judges: live progress, calibration summaries, parity reports.
HIT_THRESHOLD = 0.5


def is_hit(cached_tokens: int | None, prompt_tokens: int | None, threshold: float) -> bool:
    """One turn's hit: more than `threshold` of its prompt served from cache (the tables' definition too)."""
    return bool(prompt_tokens) and (cached_tokens or 0) > threshold * (prompt_tokens or 0)


# Columns of each table, in file order: (name, type, nullable). Types are Arrow's names.
COLUMNS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "turns": (
        ("session", "int64", False),
        ("kind", "string", False),
        ("turn", "int32", False),
        ("request_id", "int64", True),
        ("send_time", "float64", False),
        ("first_token_time", "float64", True),
        ("done_time", "float64", True),
        ("prompt_tokens", "int64", True),
        ("cached_tokens", "int64", True),
        ("completion_tokens", "int64", True),
        ("n_output_ids", "int64", True),
        ("queue_time", "float64", True),
        ("engine_ttft", "float64", True),
        ("engine_decode", "float64", True),
        ("status", "string", False),
        ("http_status", "int32", True),
        ("error", "string", True),
    ),
    "sessions": (
        ("session", "int64", False),
        ("kind", "string", False),
        ("stream", "int32", True),
        ("index", "int32", True),
        ("arrival", "float64", False),
        ("admission", "float64", True),
        ("end", "float64", True),
        ("outcome", "string", False),
        ("n_turns", "int32", True),
        ("turns_done", "int32", True),
        ("start_lateness", "float64", True),
        ("gate_wait", "float64", True),
        ("paused_time", "float64", True),
    ),
    "gate_events": (
        ("time", "float64", False),
        ("event", "string", False),
        ("session", "int64", True),
        ("queue_new", "int32", True),
        ("queue_resume", "int32", True),
        ("admitted", "int32", True),
        ("cap", "int32", True),
    ),
    "gauges": (
        ("time", "float64", False),
        ("running", "float64", True),
        ("waiting", "float64", True),
        ("kv_used_tokens", "float64", True),
        ("kv_evictable_tokens", "float64", True),
        ("pool_tokens", "float64", True),
        ("prompt_tokens_total", "float64", True),
        ("cached_tokens_total", "float64", True),
        ("generation_tokens_total", "float64", True),
        ("preemptions_total", "float64", True),
    ),
}
TABLES = tuple(COLUMNS)


def read_meta(run_dir: Path) -> dict[str, Any] | None:
    """A run directory's meta.json as a mapping, or None where there is none to read (missing,
    unreadable, not JSON, or JSON that is no object): callers that scan folders for runs skip such
    a directory rather than fail on it; load_run is the strict reader."""
    try:
        meta = orjson.loads((Path(run_dir) / "meta.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return meta if isinstance(meta, dict) else None
