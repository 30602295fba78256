"""The plan file: what a frozen plan is, and its exact bytes on disk (paper App. E.2).

A plan is identified by the SHA-256 of its file, so the file must be byte-identical for equal
inputs in any process: a fixed schema, rows in a fixed order, canonical JSON metadata in the
Parquet schema, a fixed writer configuration, no timestamps. Generation is harness/workload/plans.py.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from harness.atomic import write_bytes_atomic
from harness.config import DEFAULT_TOP_RATE, ProtocolConfig, WorkloadConfig, parse_config
from harness.errors import PlanError
from harness.workload.draws import SessionSpec

GENERATOR_VERSION = 1  # bump on any change that alters a plan's bytes for the same inputs
META_KEY = b"agentload.plan"

_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string(), nullable=False),
        pa.field("stream", pa.int32(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
        pa.field("arrival", pa.float64(), nullable=False),
        pa.field("n_turns", pa.int32(), nullable=False),
        pa.field("tool_times", pa.list_(pa.float64()), nullable=False),
        pa.field("token_seed", pa.int64(), nullable=False),
        pa.field("refused", pa.bool_(), nullable=False),
    ]
)


@dataclass(frozen=True)
class Plan:
    """A frozen plan. ``sessions[i]`` is client-wide session id i (the row in the file)."""

    sessions: tuple[SessionSpec, ...]
    meta: dict[str, Any]
    sha256: str | None = None  # of the file's bytes; None until written or when built in memory

    @property
    def workload(self) -> WorkloadConfig:
        return parse_config(self.meta["workload"], WorkloadConfig, "plan metadata: workload")

    @property
    def protocol(self) -> ProtocolConfig:
        return parse_config(self.meta["protocol"], ProtocolConfig, "plan metadata: protocol")

    @property
    def rate_abs(self) -> float:
        return float(self.meta["rate_abs"])

    @property
    def lambda_ref(self) -> float:
        return float(self.meta["lambda_ref"])

    @property
    def top_rate(self) -> float:
        return float(self.meta.get("top_rate", DEFAULT_TOP_RATE))

    def of_kind(self, kind: str) -> list[SessionSpec]:
        return [s for s in self.sessions if s.kind == kind]

    def nominal_rate(self, t: float) -> float:
        """Absolute base arrival rate at time t (piecewise constant: CUT changes it)."""
        cut = self.meta["arm"]["cut"]
        if cut is not None and t >= cut["start"]:
            return float(cut["rate"]) * self.lambda_ref
        return self.rate_abs

    def expected_arrivals(self, start: float, end: float) -> float:
        """Integral of the nominal base rate over [start, end)."""
        cut = self.meta["arm"]["cut"]
        if cut is None or end <= cut["start"]:
            return self.rate_abs * (end - start)
        c = max(start, float(cut["start"]))
        return self.rate_abs * max(0.0, c - start) + float(cut["rate"]) * self.lambda_ref * (end - c)


def _canonical(obj: Any) -> bytes:
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def plan_bytes(plan: Plan) -> bytes:
    """The exact bytes of the plan file: a fixed schema, fixed row order, canonical metadata."""
    s = plan.sessions
    table = pa.table(
        {
            "kind": pa.array([x.kind for x in s], pa.string()),
            "stream": pa.array([x.stream for x in s], pa.int32()),
            "index": pa.array([x.index for x in s], pa.int32()),
            "arrival": pa.array([x.arrival for x in s], pa.float64()),
            "n_turns": pa.array([x.n_turns for x in s], pa.int32()),
            "tool_times": pa.array([list(x.tool_times) for x in s], pa.list_(pa.float64())),
            "token_seed": pa.array([x.token_seed for x in s], pa.int64()),
            "refused": pa.array([x.refused for x in s], pa.bool_()),
        },
        schema=_SCHEMA.with_metadata({META_KEY: _canonical(plan.meta)}),
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", compression_level=3, use_dictionary=["kind"], version="2.6")
    return sink.getvalue()


def write_plan(plan: Plan, path: Path | str) -> str:
    """Write the plan atomically and return the SHA-256 of its bytes."""
    data = plan_bytes(plan)
    write_bytes_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def read_plan(path: Path | str) -> Plan:
    """Read a plan file; ``sha256`` is that of the bytes read, for the run's meta.json."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"{path}: cannot read plan: {exc.strerror}") from None
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as exc:
        raise PlanError(f"{path}: not a Parquet plan file ({exc})") from None
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise PlanError(f"{path}: Parquet file without plan metadata (key {META_KEY.decode()}); not a plan")
    meta = orjson.loads(raw)
    cols = table.to_pydict()
    sessions = tuple(
        SessionSpec(
            stream=cols["stream"][i],
            index=cols["index"][i],
            arrival=cols["arrival"][i],
            n_turns=cols["n_turns"][i],
            tool_times=tuple(cols["tool_times"][i]),
            token_seed=cols["token_seed"][i],
            refused=cols["refused"][i],
        )
        for i in range(table.num_rows)
    )
    return Plan(sessions=sessions, meta=meta, sha256=hashlib.sha256(data).hexdigest())
