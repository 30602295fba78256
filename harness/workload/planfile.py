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

import numpy as np
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


def _over(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """A pyarrow array over a numpy array's bytes (no validity bitmap: plan columns have no nulls).

    Why not `pa.array`: given a list, or even a numpy array, it first asks pandas whether the object
    is one of its own, importing pandas, about 0.3 s that `prereg check` and `plan` would pay for
    nothing (issue 24); an array over the buffers asks nobody."""
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(np.ascontiguousarray(values))])


def plan_bytes(plan: Plan) -> bytes:
    """The exact bytes of the plan file: a fixed schema, fixed row order, canonical metadata.

    The columns are built over numpy buffers (`_over`); the bytes are those of the same table built
    from Python lists (tests/unit/harness/test_plans.py), on which every registered plan hash rests."""
    s = plan.sessions
    n = len(s)
    kinds = [x.kind.encode() for x in s]
    kind_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.fromiter(map(len, kinds), np.int32, n), out=kind_offsets[1:])
    kind = pa.StringArray.from_buffers(n, pa.py_buffer(kind_offsets), pa.py_buffer(b"".join(kinds)))
    tool_offsets = np.zeros(n + 1, np.int32)
    np.cumsum(np.fromiter((len(x.tool_times) for x in s), np.int32, n), out=tool_offsets[1:])
    tool_values = np.fromiter((t for x in s for t in x.tool_times), np.float64, int(tool_offsets[-1]))
    tool_times = pa.Array.from_buffers(
        pa.list_(pa.float64()), n, [None, pa.py_buffer(tool_offsets)], children=[_over(tool_values, pa.float64())]
    )
    refused = np.packbits(np.fromiter((x.refused for x in s), np.bool_, n), bitorder="little")
    columns = [
        kind,
        _over(np.fromiter((x.stream for x in s), np.int32, n), pa.int32()),
        _over(np.fromiter((x.index for x in s), np.int32, n), pa.int32()),
        _over(np.fromiter((x.arrival for x in s), np.float64, n), pa.float64()),
        _over(np.fromiter((x.n_turns for x in s), np.int32, n), pa.int32()),
        tool_times,
        _over(np.fromiter((x.token_seed for x in s), np.int64, n), pa.int64()),
        pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(refused)]),
    ]
    table = pa.Table.from_arrays(columns, schema=_SCHEMA.with_metadata({META_KEY: _canonical(plan.meta)}))
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
