"""The kept filters and column reads of a run's tables (analysis.metrics.kept_tables) are the
direct ones.

While a run is scored, `completed_turns`, `present_sessions` and `column` keep what they took of a
table and hand it out again (speed only: `agentload analyze` filters each table a dozen times);
these tests keep the direct forms beside them, on tables with the dtypes the recorder's Parquet
files load as, nulls and all, and check that outside a scope nothing is kept (a caller may change
a table between calls)."""

from __future__ import annotations

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
    turns["cached"] = pd.array([None if i % 7 == 0 else i for i in range(n)], dtype="Int64")
    sessions = pa.table({"outcome": outcome, "arrival": rng.random(n)}).to_pandas()
    return turns, sessions


def test_kept_subsets_and_columns_are_the_direct_ones() -> None:
    for seed in range(60):
        turns, sessions = _tables(seed)
        want_t = turns[turns["status"] == "ok"]
        want_s = sessions[sessions["outcome"] != "refused"]
        want_c = {name: turns[name].to_numpy(dtype=float, na_value=np.nan) for name in ("done_time", "turn", "cached")}
        with metrics.kept_tables():
            for _twice in range(2):  # the second call hands out what was kept
                pd.testing.assert_frame_equal(metrics.completed_turns(turns), want_t)
                pd.testing.assert_frame_equal(metrics.present_sessions(sessions), want_s)
                for name, want in want_c.items():
                    got = metrics.column(turns, name)
                    np.testing.assert_array_equal(got, want)
                    assert not got.flags.writeable  # kept: a write would change what the next caller reads
            assert metrics.completed_turns(turns) is metrics.completed_turns(turns)
            assert np.isnan(metrics.column(turns, "absent")).all()
            assert metrics.column(turns, "absent", 1.0).sum() == len(turns)


def test_each_table_gets_its_own_subset() -> None:
    turns, _ = _tables(3)
    other = turns.copy()
    other.loc[other.index[0], "status"] = "ok" if other["status"].iloc[0] != "ok" else "error"
    with metrics.kept_tables():
        a, b = metrics.completed_turns(turns), metrics.completed_turns(other)
        pd.testing.assert_frame_equal(b, other[other["status"] == "ok"])
        assert len(a) != len(b)


def test_outside_a_scope_a_changed_table_reads_as_changed() -> None:
    turns, sessions = _tables(4)
    assert len(metrics.present_sessions(sessions)) == int((sessions["outcome"] != "refused").sum())
    sessions["outcome"] = "completed"  # changed in place between calls
    assert len(metrics.present_sessions(sessions)) == len(sessions)
    before = metrics.column(turns, "done_time").copy()
    turns["done_time"] = turns["done_time"] + 1.0
    np.testing.assert_array_equal(metrics.column(turns, "done_time"), before + 1.0)
    with metrics.kept_tables():
        metrics.column(turns, "done_time")
    assert metrics._KEPT is None  # the scope's keep is dropped with it
