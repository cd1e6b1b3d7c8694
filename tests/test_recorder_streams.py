"""Per-token observations as streams (issue 21): the recorder's column store, the pooled ITL buffer and the
column-wise decision frame give exactly what the row dicts and the concatenated gap arrays gave."""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd
import pytest

from harness.core.recorder import (DECISION_COLUMNS, ColumnStore, HoldDecision, ItlPool, PlaceDecision, PlanDecision,
                              ViewDigest, decision_row, decisions_frame)
from harness.analysis.validity import serving_metrics


def _parquet(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()


def test_column_store_frame_is_the_row_dict_frame_on_mixed_columns():
    cols = ["f", "i", "f_then_nan", "i_then_float", "i_then_none", "s", "b", "npf", "big", "obj", "none"]
    rows = [
        (0.5, 1, 1.0, 2, 3, "a", True, np.float64(1.5), 1, 1, None),
        (1.5, 2, math.nan, 2.5, None, "b", False, np.float64(2.5), 2 ** 70, "x", None),
        (2.5, -3, 3.0, 4, 5, "", True, np.float64(3.5), 3, 2.0, None),
    ]
    store = ColumnStore(cols)
    for r in rows:
        store.append(r)
    want = pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)
    got = store.frame()
    assert list(got.dtypes) == list(want.dtypes)
    pd.testing.assert_frame_equal(got, want)
    plain = [c for c in cols if c not in ("big", "obj")]      # parquet takes neither a 2**70 nor an int/str mix
    assert _parquet(got[plain]) == _parquet(want[plain])
    assert got["f"].dtype == np.float64 and got["i"].dtype == np.int64     # typed columns stay typed
    assert len(store) == 3 and store.rows()[1]["s"] == "b" and store.column("i") == [1, 2, -3]


def test_column_store_empty_and_single_row():
    cols = ["a", "b"]
    empty = ColumnStore(cols)
    assert _parquet(empty.frame()) == _parquet(pd.DataFrame([], columns=cols)) and empty.rows() == []
    one = ColumnStore(cols)
    one.append((1.0, "x"))
    assert _parquet(one.frame()) == _parquet(pd.DataFrame([{"a": 1.0, "b": "x"}], columns=cols))


def test_itl_pool_by_hand():
    pool = ItlPool()
    pool.add([1.0, 2.0])
    pool.add(np.array([], dtype=float))
    pool.add(np.array([3.0, 4.0]))
    # by hand: mean (1+2+3+4)/4 = 2.5; p50 at rank 1.5 -> 2.5; p99 at rank 3 * 0.99 = 2.97 -> 3 + 0.97 * 1
    mean, pct = pool.stats([50, 99])
    assert mean == 2.5 and pct[50.0] == 2.5 and pct[99.0] == pytest.approx(3.97, abs=1e-12)
    assert pool.stats([50, 99]) == (mean, pct)          # computed once, the same again
    with pytest.raises(RuntimeError):
        pool.add([5.0])                                 # the buffer was reordered by the partition
    with pytest.raises(RuntimeError):
        pool.stats([90])
    m, p = ItlPool().stats([50])
    assert math.isnan(m) and math.isnan(p[50.0])


@pytest.mark.parametrize("bad", [None, math.nan, math.inf])
def test_itl_pool_matches_numpy_on_the_concatenated_gaps(bad):
    rng = np.random.default_rng(7)
    chunks = [rng.exponential(0.02, int(rng.integers(0, 40))) for _ in range(200)]
    if bad is not None:
        chunks[3] = np.append(chunks[3], bad)
    qs = [0, 50, 90, 95, 99, 99.9, 100]
    pool = ItlPool()
    for c in chunks:
        pool.add(c)
    full = np.concatenate(chunks)
    finite = full[np.isfinite(full)]
    mean, pct = pool.stats(qs)
    ref_mean = float(full.mean())
    assert mean == ref_mean or (bad is not None and math.isnan(mean) and math.isnan(ref_mean))
    for q in qs:
        assert pct[float(q)] == float(np.percentile(finite, q))   # exact, not approximately


def test_serving_metrics_same_from_the_pool_and_from_the_array():
    turns = pd.DataFrame({"status": ["ok", "ok", "failed"], "prompt_tokens": [10, 20, 5], "output_tokens": [3, 4, 0],
                          "ttft_s": [0.1, 0.3, math.nan], "tpot_s": [0.01, 0.02, math.nan], "e2e_s": [1.0, 2.0, 0.5]})
    gaps = [np.array([0.5, 0.25]), np.array([0.75, 1.0, 0.125])]
    pool = ItlPool()
    for g in gaps:
        pool.add(g)
    a = serving_metrics(turns, 10.0, [50, 90, 99], np.concatenate(gaps))
    b = serving_metrics(turns, 10.0, [50, 90, 99], pool)
    assert list(a) == list(b) and a == b
    assert b["itl_mean_s"] == (0.5 + 0.25 + 0.75 + 1.0 + 0.125) / 5
    assert b["itl_p50_s"] == 0.5                            # the median of the five gaps, by hand
    assert b["ttft_p50_s"] == pytest.approx(0.2)            # (0.1 + 0.3) / 2 over the completed turns
    assert b["request_throughput_per_s"] == 0.2             # 2 completed turns / 10 s


def test_decisions_frame_is_the_row_frame():
    v1 = ViewDigest((0.12345, 0.5), (100, 0), 0)
    v2 = ViewDigest((1.0, 0.0), (0, 2048), 3)
    ds = [PlanDecision(0.0, "plan: thresholds"),
          PlaceDecision(1.5, "c1", 0, 0, 1, "least-kv", ((0, 0.25), (1, 1.0 / 3)), v1),
          HoldDecision(2.0, "kv gate", v2),
          PlaceDecision(3.25, "c2", 4, 1, 1, "sticky", (), v2, misrouted=True)]
    names = ["p0", "d0"]
    want = pd.DataFrame([decision_row(d, names) for d in ds], columns=DECISION_COLUMNS)
    got = decisions_frame(ds, names)
    assert _parquet(got) == _parquet(want)
    assert got.candidates[1] == "p0=0.25;d0=0.333333" and got.view_kv_used_frac[1] == "0.123,0.500"
    assert _parquet(decisions_frame([], names)) == _parquet(pd.DataFrame([], columns=DECISION_COLUMNS))


def test_decisions_frame_formats_edge_values_as_the_row_frame():
    """The frame's one-format-per-length strings equal the per-value f-strings of ``decision_row`` on the
    values where printf-style and format-spec formatting could part: -0.0, NaN, inf, an int KV fraction, a
    bool / int / tiny / large score, an int beyond int64 queued, empty tuples, two instance counts, a ``%`` in
    an instance name."""
    v = ViewDigest((0.0, -0.0, math.nan, 1, math.inf), (0, 2 ** 70, 7, 12, 3), 3)
    names = ["p0", "d0", "d1", "d2", "d%s3"]   # a '%' in a name is printed as is
    ds = [PlanDecision(0.0, "plan"), HoldDecision(1.0, "h", v),
          PlaceDecision(2.0, "c", 1, 0, 1, "r", ((0, 1e-9), (1, 12345678.9), (2, True), (3, 7), (4, -0.0)), v, True),
          PlaceDecision(3.0, "c", 2, 0, 1, "r", (), ViewDigest((), (), 0)),
          PlaceDecision(4.0, "d", 0, 1, 2, "r", ((2, 0.5),), ViewDigest((0.25, 0.0005), (1, 2), 1))]
    want = pd.DataFrame([decision_row(d, names) for d in ds], columns=DECISION_COLUMNS)
    got = decisions_frame(ds, names)
    pd.testing.assert_frame_equal(got, want)
    assert got.candidates[2] == "p0=1e-09;d0=1.23457e+07;d1=1;d2=7;d%s3=-0"
    assert got.view_kv_used_frac[1] == "0.000,-0.000,nan,1.000,inf"
    assert got.view_queued_prefill_tokens[1] == "0,1180591620717411303424,7,12,3"   # 2**70 in full
    assert got.view_kv_used_frac[4] == "0.250,0.001"   # 0.0005 rounds half to even on its binary value


def test_itl_pool_release_keeps_the_statistics_and_frees_the_buffer():
    pool = ItlPool()
    with pytest.raises(RuntimeError):
        pool.release()                                  # before stats(): the pooled ITL would be lost
    pool.add([0.25, 0.75])
    before = pool.stats([50])
    pool.release()
    assert len(pool) == 0 and pool.stats([50]) == before == (0.5, {50.0: 0.5})
    with pytest.raises(RuntimeError):
        pool.gaps()
    with pytest.raises(RuntimeError):
        pool.add([1.0])


def test_column_store_an_int_beyond_int64_on_the_fast_path():
    cols = ["a", "b", "c"]
    rows = [(1, 0.5, "x"), (2 ** 64, 1.5, "y"), (3, 2.5, "z")]   # row 2 differs from row 1 only by the overflow
    store = ColumnStore(cols)
    for r in rows:
        store.append(r)
    want = pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)
    pd.testing.assert_frame_equal(store.frame(), want)
    assert store.column("a") == [1, 2 ** 64, 3] and store.column("b") == [0.5, 1.5, 2.5]


@pytest.mark.parametrize("chunk", [1, 2, 3, 7])
def test_column_store_extend_is_append_row_by_row(chunk):
    """``ColumnStore.extend`` (the buffered instance samples' path) gives the frame of the row dicts (pandas'
    own inference, the independent oracle) and the store ``append`` gives, whatever the chunks: typed columns
    stay typed across chunks; a column meeting another type (an int in a float column, a None, a numpy float, a
    bool in an int column) turns into a list from that row on; an int beyond int64 falls back row by row."""
    cols = ["f", "i", "f_then_int", "i_then_none", "s", "npf", "i_then_bool", "big"]
    rows = [(0.5 * k, k, 1.0 * k, k, f"s{k}", float(k), k, k) for k in range(6)]
    rows += [(3.5, 6, 7, None, "x", np.float64(7.5), True, 2 ** 70), (4.5, 7, 8.0, 9, "y", 8.5, 8, 9)]
    want = pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)
    one = ColumnStore(cols)
    for r in rows:
        one.append(r)
    got = ColumnStore(cols)
    for k in range(0, len(rows), chunk):
        got.extend(rows[k:k + chunk])
    got.extend([])
    assert len(got) == len(rows) == 8
    pd.testing.assert_frame_equal(got.frame(), want)
    pd.testing.assert_frame_equal(got.frame(), one.frame())
    assert got.frame()["f"].dtype == np.float64 and got.frame()["i"].dtype == np.int64
    assert type(got.column("f_then_int")[6]) is int and got.column("big")[6] == 2 ** 70   # kept as given
    # extend_columns (the recorder's buffered samples, 2026-12-07): the same rows given column by column
    by_col = ColumnStore(cols)
    for k in range(0, len(rows), chunk):
        by_col.extend_columns([list(c) for c in zip(*rows[k:k + chunk])])
    by_col.extend_columns([[] for _ in cols])
    assert len(by_col) == 8
    pd.testing.assert_frame_equal(by_col.frame(), want)
    assert [by_col.column(c) for c in cols] == [one.column(c) for c in cols]
    assert [type(v) for v in by_col.column("f_then_int")] == [type(v) for v in one.column("f_then_int")]
    assert _parquet(by_col.frame()[["f", "i", "s"]]) == _parquet(want[["f", "i", "s"]])
    plain = ["f", "i", "s"]
    assert _parquet(got.frame()[plain]) == _parquet(want[plain])
    # typed all the way in one chunk of three: one C-level extend per column, the same values
    typed = ColumnStore(["t", "n"])
    typed.extend([(0.25, 1), (0.5, 2), (0.75, 3)])
    assert typed.column("t") == [0.25, 0.5, 0.75] and typed.column("n") == [1, 2, 3]
    assert typed.frame()["n"].dtype == np.int64


def test_recorder_samples_buffered_across_a_flush(monkeypatch):
    """``Recorder.sample`` buffers its rows and moves them into the store ``SAMPLE_BATCH`` at a time: with a batch
    of 3 rows, 2 instances and 4 ticks (8 rows: moved at 4 and at 8 rows), the frame has the 8 rows in tick
    order with the values ``instance_values`` gives each (worked by hand: KV 10 * tick of a 100-token instance
    -> kv_used_frac 0.1 * tick); a read between flushes sees every row sampled so far."""
    from harness.core import recorder as R
    from harness.core.backend import InstanceInfo, InstanceState
    monkeypatch.setattr(R, "SAMPLE_BATCH", 3)
    rec = R.Recorder(lambda c, k: True)
    infos = (InstanceInfo(0, "p0", "prefill", "a40", 100), InstanceInfo(1, "d0", "decode", "a40", 200))
    rec.bind(["p0", "d0"])
    for k in range(4):
        rec.sample(float(k), infos, (InstanceState(10 * k, k, 0, 1.5 * k), InstanceState(20 * k, 1, k, 2.5 * k)),
                   [math.nan, math.nan])
        assert len(rec._samples) == (0, 4, 4, 8)[k]        # moved in batches of >= 3 rows
    assert len(rec.samples) == 8
    rec.sample(4.0, infos, (InstanceState(0, 0, 0, 6.0), InstanceState(0, 0, 0, 10.0)), [math.nan, math.nan])
    assert len(rec._samples) == 8 and len(rec.samples) == 10 and rec.samples[-1]["energy_j"] == 10.0
    df = rec.instances_frame().iloc[:8]
    assert list(df.t_s) == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert list(df.instance) == ["p0", "d0"] * 4 and list(df.kv_used_tokens) == [0, 0, 10, 20, 20, 40, 30, 60]
    assert list(df.kv_used_frac) == [0.0, 0.0, 0.1, 0.1, 0.2, 0.2, 0.3, 0.3]
    assert list(df.energy_j) == [0.0, 0.0, 1.5, 2.5, 3.0, 5.0, 4.5, 7.5] and df.kv_used_frac.dtype == np.float64
    assert list(df.num_waiting) == [0, 0, 0, 1, 0, 2, 0, 3] and df.power_w.isna().all()


def test_column_store_extend_columns_refuses_ragged_columns():
    """``ColumnStore.extend_columns`` takes one list per column, all of one length: a missing column or a short one
    is refused (nothing added)."""
    store = ColumnStore(["a", "b"])
    with pytest.raises(ValueError):
        store.extend_columns([[1, 2]])
    with pytest.raises(ValueError):
        store.extend_columns([[1, 2], [0.5]])
    assert len(store) == 0


def test_recorder_samples_by_column_are_the_instance_rows(monkeypatch):
    """The recorder buffers its instance samples column by column (2026-12-07: no row tuple per instance): ticks
    through ``sample`` and folded ticks through ``sample_at`` in one run, across a flush (``SAMPLE_BATCH`` 5), give
    the frame of the row dicts ``instance_row`` makes of the same states (the oracle: pandas' own inference; values
    by hand: 2 instances of 100 and 200 tokens, KV 10 and 30 tokens at t = 0 and 0.25, 20 and 40 at 0.5:
    kv_used_frac 0.1 and 0.15, then 0.2 and 0.2), parquet bytes equal; a new tuple of infos (another name) is read afresh."""
    from harness.core import recorder as R
    from harness.core.backend import InstanceInfo, InstanceState
    monkeypatch.setattr(R, "SAMPLE_BATCH", 5)
    infos = (InstanceInfo(0, "p0", "prefill", "a40", 100), InstanceInfo(1, "d0", "decode", "h100", 200))
    rec = R.Recorder(lambda c, k: True)
    rec.bind(["p0", "d0"])
    want = []

    def sample(t, states):
        rec.sample(t, infos, states, [math.nan, 7.5])
        want.extend(R.instance_row(t, i, st, p) for i, st, p in zip(infos, states, [math.nan, 7.5]))

    sample(0.0, (InstanceState(10, 1, 0, 1.0), InstanceState(30, 2, 1, 2.0)))
    times = [0.25, 0.5]
    cols = [([10, 20], 1, 0, [1.25, 1.5]), ([30, 40], 2, 1, [2.25, 2.5])]
    rec.sample_at(times, infos, cols, [math.nan, 7.5])
    for k, t in enumerate(times):
        want.extend(R.instance_row(t, i, InstanceState(kv[k], run, wait, e[k]), p)
                    for i, (kv, run, wait, e), p in zip(infos, cols, [math.nan, 7.5]))
    sample(1.0, (InstanceState(0, 0, 0, 3.0), InstanceState(50, 1, 0, 4.0)))
    other = (InstanceInfo(0, "p1", "prefill", "a40", 100), infos[1])
    rec.sample(2.0, other, (InstanceState(0, 0, 0, 3.0), InstanceState(50, 1, 0, 4.0)), [math.nan, 7.5])
    want.extend(R.instance_row(2.0, i, st, p) for i, st, p in zip(
        other, (InstanceState(0, 0, 0, 3.0), InstanceState(50, 1, 0, 4.0)), [math.nan, 7.5]))
    df = rec.instances_frame()
    ref = pd.DataFrame(want, columns=R.INSTANCE_COLUMNS)
    pd.testing.assert_frame_equal(df, ref)
    assert _parquet(df) == _parquet(ref)
    assert list(df.t_s) == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0, 2.0, 2.0]
    assert list(df.kv_used_frac[:6]) == [0.1, 0.15, 0.1, 0.15, 0.2, 0.2] and list(df.instance[-2:]) == ["p1", "d0"]
