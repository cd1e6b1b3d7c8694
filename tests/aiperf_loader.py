"""Read a harness AIPerf export (``python -m harness.analysis.export RUN --format aiperf``) with the ``aiperf``
package itself, and say what AIPerf read: ``read(export_dir) -> dict`` (JSON-able).

Runs in any interpreter that has aiperf 0.13.0 (``pip install aiperf==0.13.0``, best in a venv of its own:
docs/outputs.md "AIPerf"). tests/test_export_aiperf.py imports it where ``aiperf`` imports, else runs it as a
script under that interpreter::

    AIPERF_PYTHON=/path/to/aiperf-venv/bin/python python -m pytest tests/test_export_aiperf.py
    /path/to/aiperf-venv/bin/python tests/aiperf_loader.py OUT.json EXPORT_DIR...   # {EXPORT_DIR: read(...)}

What it uses (aiperf 0.13.0): ``aiperf.common.models.export_models.JsonExportData`` (the summary file;
its ``input_config`` is validated as ``aiperf.config.config.BenchmarkConfig``, unknown keys forbidden),
``JsonMetricResult.project_summary_dict`` (every metric block), ``aiperf.common.models.record_models
.MetricRecordInfo`` (each JSONL line), and ``aiperf.plot.core.data_loader.DataLoader.load_run`` (the loader
``aiperf plot`` and its dashboard read a run directory with: run metadata -- model, concurrency, request count,
endpoint type, duration -- and one row per request; lines it cannot parse it skips with a warning, so the
caller compares the row count with the requests it exported). Standard library only besides aiperf.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUR_MARKS = ("partial", "partial_error")   # the harness's own keys on a partial run's export


def read(export_dir: str | Path) -> dict:
    """What aiperf reads from ``export_dir`` (holding ``profile_export_aiperf.json``/``.csv`` and
    ``profile_export.jsonl``). Raises whatever aiperf raises on a file it rejects (pydantic's
    ``ValidationError``, aiperf's ``DataLoadError``)."""
    import warnings

    import aiperf
    from aiperf.common.models.export_models import JsonExportData, JsonMetricResult
    from aiperf.common.models.record_models import MetricRecordInfo
    from aiperf.plot.core.data_loader import DataLoader

    d = Path(export_dir)
    raw = json.loads((d / "profile_export_aiperf.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = JsonExportData.model_validate(raw)
        metrics = JsonMetricResult.project_summary_dict(raw)
        records = [MetricRecordInfo.model_validate_json(line)
                   for line in (d / "profile_export.jsonl").read_text().splitlines() if line.strip()]
        run = DataLoader().load_run(d)
    cfg = data.input_config
    phase = cfg.phases[0]
    undeclared = sorted(k for k in (data.model_extra or {}) if k not in metrics and k not in OUR_MARKS)
    req = run.requests
    return {
        "aiperf_version": aiperf.__version__,
        "schema_version": data.schema_version,
        "model": run.metadata.model,
        "concurrency": run.metadata.concurrency,
        "request_count": run.metadata.request_count,
        "endpoint_type": run.metadata.endpoint_type,
        "duration_s": run.metadata.duration_seconds,
        "was_cancelled": run.metadata.was_cancelled,
        "is_complete": data.is_complete,
        "phase": phase.model_dump(mode="json", exclude_none=True),
        "endpoint": {"urls": list(cfg.endpoint.urls), "streaming": bool(cfg.endpoint.streaming)},
        "slos": dict(cfg.slos or {}),
        "random_seed": data.run_info.random_seed if data.run_info else None,
        "metrics": {k: m.model_dump(mode="json", exclude_none=True) for k, m in metrics.items()},
        "undeclared_keys": undeclared,
        "records": len(records),
        "rows": 0 if req is None else int(len(req)),
        "requests": [] if req is None else [
            {"conversation_id": r["conversation_id"], "turn_index": int(r["turn_index"]),
             "request_start_ns": int(r["request_start_ns"]), "request_end_ns": int(r["request_end_ns"]),
             "credit_issued_ns": None if r.get("credit_issued_ns") is None else int(r["credit_issued_ns"]),
             "output_sequence_length": r.get("output_sequence_length")}
            for r in req.to_dict("records")],
    }


def _clean(obj):
    """NaN (pandas' missing value in the request rows) -> None, so the JSON is strict."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


if __name__ == "__main__":   # one interpreter start for every directory: importing aiperf takes seconds
    if len(sys.argv) < 3:
        sys.exit("usage: aiperf_loader.py OUT.json EXPORT_DIR...")
    Path(sys.argv[1]).write_text(json.dumps({d: _clean(read(d)) for d in sys.argv[2:]}, allow_nan=False))
