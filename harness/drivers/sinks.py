"""What the drivers write to while they play a client: the run's recorder and a progress display.

Why interfaces and not the classes: a driver is used by the runner (a `RunRecorder`, a
`RunProgress`), by sim2real replays, by calibration stages and by tests with a recorder of their
own, and it must not import the recording package's writer (Parquet, pandas) to be typed. Each
interface (a `typing.Protocol`) names only the methods a driver calls; `RunRecorder` and `RunProgress` satisfy them.

Gauges. An engine may export more gauges than the run record keeps (vLLM's `kv_usage_frac`, the
emulator's extras); `gauge_values` keeps the columns of the record's gauges table
(harness/recording/schema.py), so what a driver writes is what the format says, whatever the
recorder.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from harness.recording.schema import COLUMNS

#: The gauges table's value columns (every column but `time`), in file order.
GAUGE_FIELDS: tuple[str, ...] = tuple(name for name, _, _ in COLUMNS["gauges"] if name != "time")


class GaugeRecorder(Protocol):
    """Takes one engine metrics sample: `time` (plan seconds) and the gauge columns it has."""

    def gauge(
        self,
        *,
        time: float,
        running: float | None = ...,
        waiting: float | None = ...,
        kv_used_tokens: float | None = ...,
        kv_evictable_tokens: float | None = ...,
        pool_tokens: float | None = ...,
        prompt_tokens_total: float | None = ...,
        cached_tokens_total: float | None = ...,
        generation_tokens_total: float | None = ...,
        preemptions_total: float | None = ...,
    ) -> None: ...


class DriveRecorder(GaugeRecorder, Protocol):
    """The wall-clock driver's recorder: gauges, and a flush when the drive ends (rows on disk even
    if the process is killed before the recorder is closed)."""

    def flush(self) -> None: ...


class DriveProgress(Protocol):
    """A live display of one run (harness.recording.progress.RunProgress)."""

    def on_turn(self, t: float, prompt_tokens: int | None, cached_tokens: int | None, status: str) -> None: ...

    def on_gauges(self, t: float, values: dict[str, float]) -> None: ...

    def update(
        self,
        t: float,
        *,
        in_system: int | None = None,
        in_flight: int | None = None,
        held: int | None = None,
        errors: int | None = None,
        final: bool = False,
    ) -> None: ...


def gauge_values(values: Mapping[str, float]) -> dict[str, float]:
    """The sample's values for the gauges table's columns, as floats (others dropped)."""
    return {k: float(v) for k, v in values.items() if k in GAUGE_FIELDS}


def write_gauge(recorder: GaugeRecorder, t: float, values: Mapping[str, float]) -> None:
    """One gauge row: plan time `t` and the columns of the gauges table the sample has."""
    recorder.gauge(time=t, **gauge_values(values))
