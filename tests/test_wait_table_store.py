"""``scripts/wait_table.py``'s result store (``<out>/runs.csv``) holds run.py's guarantees (issue 50): a second
run into a locked ``--out`` is refused (exit 2, the holder named) instead of doing every job again beside the
first; a row of another fingerprint (code, scripts, config, profile data) is not reused; a torn last line (a
writer killed mid-row) is dropped and cut off, never a ``TypeError``; a ``runs.csv`` written before
fingerprints is read (``--report-only``) and migrated (a run). Each run here is one 8-prompt simulation."""

from __future__ import annotations

import csv
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

from harness.core.paths import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "wait_table.py"
TASK = ("roofline", "sarathi", 23.0, 0, 8)     # (step model, arm, prompts/s, seed, prompts)


@pytest.fixture(scope="module")
def wt():
    spec = importlib.util.spec_from_file_location("wait_table_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(wt, task, e2e: float, growth: float, fp: str) -> dict:
    m, arm, rate, seed, n = task
    return {"model": m, "arm": arm, "rate": rate, "seed": seed, "n": n, "e2e_central_mean_s": e2e,
            "growth_ratio": growth, "wall_s": 0.1, "fingerprint": fp}


def _write(path, fields, rows, tail: str = "") -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
        f.write(tail)


def _central_mean(wt, task) -> float:
    """The row's measure computed here from the simulation itself (``e2e_series``), not through the store."""
    m, arm, rate, seed, n = task
    e2e = wt.e2e_series(wt.ARMS[arm], rate, n, seed, m)
    return float(e2e[len(e2e) // 4: 3 * len(e2e) // 4].mean())


def test_a_second_run_into_a_locked_out_is_refused_and_runs_nothing(wt, tmp_path):
    store = wt.Store(tmp_path / "runs.csv")        # this process writes to tmp_path (holds its lock)
    try:
        before = (tmp_path / "runs.csv").read_bytes()
        env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT))
        r = subprocess.run([sys.executable, str(SCRIPT), "--rates", "23", "--seeds", "0,1", "--n", "8", "--jobs", "1",
                            "--no-capacity", "--out", str(tmp_path)], capture_output=True, text=True, env=env,
                           timeout=600)
        assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-2000:]
        assert "Traceback" not in r.stderr
        err = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
        assert len(err) == 1 and f"in use by another run: pid {os.getpid()} " in err[0] and "--out" in err[0], r.stderr
        assert (tmp_path / "runs.csv").read_bytes() == before     # no job of the second run was done
    finally:
        store.close()
    assert not (tmp_path / wt.LOCK_NAME).exists()                  # released
    wt.Store(tmp_path / "runs.csv").close()                        # and takeable again


def test_rows_of_another_fingerprint_are_not_reused(wt, tmp_path, capsys):
    path = tmp_path / "runs.csv"
    _write(path, wt.FIELDS, [_row(wt, TASK, 999.0, 9.0, "0123456789abcdef")])   # another code's row
    store = wt.Store(path)
    try:
        (row,) = store.run(None, [TASK])
    finally:
        store.close()
    assert "rows of another fingerprint" in capsys.readouterr().err
    fp = wt.fingerprint()["digest"]
    assert row["fingerprint"] == fp and row["e2e_central_mean_s"] == pytest.approx(_central_mean(wt, TASK), rel=1e-12)
    rows, torn = wt.read_runs(path)
    assert torn == 0 and [r["fingerprint"] for _, r in rows] == ["0123456789abcdef", fp]   # appended, old kept
    # the same fingerprint: reused, nothing appended; another one (a code change): recomputed
    store = wt.Store(path)
    try:
        assert store.run(None, [TASK])[0]["e2e_central_mean_s"] == row["e2e_central_mean_s"]
    finally:
        store.close()
    assert len(wt.read_runs(path)[0]) == 2
    saved = list(wt._FP)
    wt._FP[:] = [{"digest": "fedcba9876543210", "components": {**saved[0]["components"], "code": "x" * 32}}]
    try:
        store = wt.Store(path)
        try:
            assert store.run(None, [TASK])[0]["fingerprint"] == "fedcba9876543210"
        finally:
            store.close()
        assert "code (" in capsys.readouterr().err       # the change is named (fingerprints.json)
    finally:
        wt._FP[:] = saved
    assert len(wt.read_runs(path)[0]) == 3


def test_a_torn_last_line_is_dropped_and_cut_before_the_next_row(wt, tmp_path, capsys):
    path = tmp_path / "runs.csv"
    fp = wt.fingerprint()["digest"]
    good = _row(wt, ("roofline", "sarathi", 23.0, 1, 8), 0.5, 1.0, fp)
    _write(path, wt.FIELDS, [good], tail="roofline,sarathi,23.0,0,8,0.4")   # killed mid-row: no newline
    rows, torn = wt.read_runs(path)
    assert [r["seed"] for _, r in rows] == [1] and torn == len("roofline,sarathi,23.0,0,8,0.4")
    store = wt.Store(path)
    try:
        assert set(store.rows) == {store.key(good)}
        assert "dropped a torn last line" in capsys.readouterr().err
        store.run(None, [TASK])                    # the torn row's job, done again and appended whole
    finally:
        store.close()
    rows, torn = wt.read_runs(path)
    assert torn == 0 and [(r["seed"], r["fingerprint"]) for _, r in rows] == [(1, fp), (0, fp)]
    assert np.isfinite(rows[1][1]["growth_ratio"])
    # a complete line that is not a row is an error naming the file and line, not a TypeError
    _write(path, wt.FIELDS, [good], tail="roofline,sarathi,23.0\n")
    with pytest.raises(ValueError, match=r"runs\.csv:3: not a row"):
        wt.read_runs(path)


def test_a_runs_csv_from_before_fingerprints_is_reported_and_migrated(wt, tmp_path, capsys):
    """The shipped ``docs/data/wait_table/runs.csv`` has no fingerprint column: ``--report-only`` still
    reprints it (with a warning), and a run adds the column and recomputes those rows."""
    path = tmp_path / "runs.csv"
    old_fields = [f for f in wt.FIELDS if f != "fingerprint"]
    _write(path, old_fields, [_row(wt, TASK, 999.0, 9.0, "")])
    ro = wt.Store(path, readonly=True)
    assert ro.foreign == 1 and ro.rows[ro.key(_row(wt, TASK, 0, 0, ""))]["e2e_central_mean_s"] == 999.0
    assert not (tmp_path / wt.LOCK_NAME).exists() and not (tmp_path / wt.FINGERPRINTS).exists()
    with pytest.raises(RuntimeError, match="read-only"):
        ro.run(None, [("roofline", "sarathi", 23.0, 5, 8)])
    ro.close()
    assert "written before fingerprints" in capsys.readouterr().err
    store = wt.Store(path)
    try:
        assert store.rows == {}
        store.run(None, [TASK])
    finally:
        store.close()
    with open(path, newline="") as f:
        assert next(csv.reader(f)) == wt.FIELDS
    rows, _ = wt.read_runs(path)
    assert [r["fingerprint"] for _, r in rows] == ["", wt.fingerprint()["digest"]]
    assert rows[0][1]["e2e_central_mean_s"] == 999.0 and rows[1][1]["e2e_central_mean_s"] != 999.0
