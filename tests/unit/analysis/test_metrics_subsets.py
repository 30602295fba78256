"""The kept subsets of a run's tables (analysis.metrics._subset) are the direct filters.

`completed_turns` and `present_sessions` keep the filter they took of a table for as long as the
table lives (speed only: `agentload analyze` filters each table a dozen times); these tests keep
the direct filter beside them, on tables with the dtypes the recorder's Parquet files load as,
nulls and all, and check that a kept subset is dropped with its table."""

from __future__ import annotations

import gc

import numpy as np
import pandas as pd
import pyarrow as pa

from analysis import metrics


def _tables(seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    status = rng.choice(["ok", "error", "timeout", "unfinished", None], size=n).tolist()
    outcome = rng.choice(["completed", "failed", "refused", "unfinished", None], size=n).tolist()
    turns = pa.table({"status": status, "done_time": rng.random(n), "turn": rng.integers(1, 9, n)}).to_pandas(
        types_mapper={pa.string(): pd.ArrowDtype(pa.string())}.get if seed % 2 else None
    )
    sessions = pa.table({"outcome": outcome, "arrival": rng.random(n)}).to_pandas()
    return turns, sessions


def test_kept_subsets_are_the_direct_filters() -> None:
    for seed in range(60):
        turns, sessions = _tables(seed)
        want_t = turns[turns["status"] == "ok"]
        want_s = sessions[sessions["outcome"] != "refused"]
        for _twice in range(2):  # the second call hands out the kept subset
            pd.testing.assert_frame_equal(metrics.completed_turns(turns), want_t)
            pd.testing.assert_frame_equal(metrics.present_sessions(sessions), want_s)
        assert metrics.completed_turns(turns) is metrics.completed_turns(turns)


def test_a_table_of_equal_content_gets_its_own_subset() -> None:
    turns, _ = _tables(3)
    other = turns.copy()
    other.loc[other.index[0], "status"] = "ok" if other["status"].iloc[0] != "ok" else "error"
    a, b = metrics.completed_turns(turns), metrics.completed_turns(other)
    pd.testing.assert_frame_equal(b, other[other["status"] == "ok"])
    assert len(a) != len(b)


def test_kept_subsets_go_with_their_table() -> None:
    gc.collect()
    before = len(metrics._SUBSETS)
    turns, sessions = _tables(5)
    metrics.completed_turns(turns)
    metrics.present_sessions(sessions)
    assert len(metrics._SUBSETS) == before + 2
    del turns, sessions
    gc.collect()
    assert len(metrics._SUBSETS) == before and not metrics._WATCHED - {k[0] for k in metrics._SUBSETS}


def test_kept_columns_are_the_direct_conversion() -> None:
    gc.collect()
    before = len(metrics._COLUMNS)
    for seed in range(30):
        turns, sessions = _tables(seed)
        turns["cached"] = pd.array([None if i % 7 == 0 else i for i in range(len(turns))], dtype="Int64")
        for name in ("done_time", "turn", "cached"):
            want = turns[name].to_numpy(dtype=float, na_value=np.nan)
            for _twice in range(2):
                got = metrics.column(turns, name)
                np.testing.assert_array_equal(got, want)
                assert not got.flags.writeable  # kept: a write would change what the next caller reads
        assert np.isnan(metrics.column(turns, "absent")).all() and metrics.column(turns, "absent", 1.0).sum() == len(
            turns
        )
    del turns, sessions
    gc.collect()
    assert len(metrics._COLUMNS) == before
