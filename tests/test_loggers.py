"""Run loggers: W&B offline runs hold the logged config and summary (read back from the run's own
transaction log), the W&B run is closed even when the run fails, nothing breaks without wandb or with
logger=parquet, and no secret reaches any file."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from harness.run.loggers import NullLogger, is_secret_key, logged_run, scrub, start_logger
from harness.run.runner import execute
from tests.conftest import compose_cfg, compose_run
from tests.wandb_log import read_offline_run

FAKE_API_KEY = "0123456789abcdef0123456789abcdef01234567"  # the shape of a W&B API key (40 hex digits)
FAKE_TOKEN = "hf_NOT_A_REAL_TOKEN_but_secret_9f8e7d"


@pytest.mark.parametrize("key", ["api_key", "WANDB_API_KEY", "apiKey", "hf_token", "token", "access-token",
                                 "GITHUB_TOKEN", "client_secret", "db_password", "passwd", "private_key",
                                 "credentials", "Authorization"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["max_num_batched_tokens", "prompt_tokens", "kv_bytes_per_token", "tokens_per_joule",
                                 "output_tokens_per_joule", "new_input_tokens", "name", "tokens_served",
                                 "turn_output_tokens", "max_tokens"])
def test_token_counts_are_not_secrets(key):
    assert not is_secret_key(key)


def test_scrub_is_recursive_and_keeps_the_rest():
    cfg = {"engine": {"max_num_batched_tokens": 8192}, "backend": {"extra": [{"hf_token": "x"}], "api_key": "y"},
           "password": {"nested": "z"}, "model": {"kv_bytes_per_token": 114688}}
    assert scrub(cfg) == {"engine": {"max_num_batched_tokens": 8192},
                          "backend": {"extra": [{"hf_token": "<redacted>"}], "api_key": "<redacted>"},
                          "password": "<redacted>", "model": {"kv_bytes_per_token": 114688}}


def tiny_overrides(*extra):
    return ["workload.num_conversations=3", "workload.max_turns=4", "logger.progress=false", *extra]


def config_with_secrets(overrides) -> dict:
    """The run's resolved config as run.py passes it, plus two credentials a careless user might add."""
    cfg = OmegaConf.to_container(compose_cfg(overrides), resolve=True)
    cfg["backend"]["hf_token"] = FAKE_TOKEN
    cfg["logger"]["wandb_api_key"] = FAKE_API_KEY
    return cfg


def offline_env(monkeypatch, tmp_path: Path) -> Path:
    wdir = tmp_path / "wandb_dir"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wdir))
    monkeypatch.setenv("WANDB_API_KEY", FAKE_API_KEY)
    monkeypatch.setenv("WANDB_SILENT", "true")
    return wdir


def offline_run_dir(wdir: Path) -> Path:
    runs = sorted((wdir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    return runs[0]


def read_closed_run(rdir: Path, timeout_s: float = 30.0) -> dict:
    """The offline run's records once its exit record is on disk: ``run.finish()`` returns before
    wandb's service has flushed the transaction log."""
    deadline = time.monotonic() + timeout_s
    while True:
        logged = read_offline_run(rdir)
        if logged["exit_code"] is not None or time.monotonic() > deadline:
            return logged
        time.sleep(0.2)


def assert_no_secret_in(*roots: Path) -> None:
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file():
                data = f.read_bytes()
                assert FAKE_API_KEY.encode() not in data, f
                assert FAKE_TOKEN.encode() not in data, f


def test_wandb_offline_run_holds_config_summary_tables_and_series(monkeypatch, tmp_path: Path):
    """... and its figures are rendered as PNG only (no PDF, whose font subsetting logged ~165 fontTools lines),
    with fontTools / matplotlib at WARNING."""
    pytest.importorskip("wandb")
    pytest.importorskip("seaborn")
    import logging

    from harness.analysis import plotting
    saved: list[str] = []
    real_save = plotting._save

    def recording_save(fig, out, name):
        paths = real_save(fig, out, name)
        saved.extend(p.suffix for p in paths)
        return paths
    monkeypatch.setattr(plotting, "_save", recording_save)
    from harness.analysis import report
    monkeypatch.setattr(report, "_save", recording_save)
    for name in ("fontTools", "matplotlib"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.INFO)
    wdir = offline_env(monkeypatch, tmp_path)
    overrides = tiny_overrides("logger=wandb")
    run = compose_run(overrides)
    out = tmp_path / "run"
    with logged_run(run.cfg.logger, out, config_with_secrets(overrides)):
        execute(run, out, OmegaConf.to_yaml(compose_cfg(overrides)))
    summary = json.loads((out / "summary.json").read_text())
    rdir = offline_run_dir(wdir)
    logged = read_closed_run(rdir)
    for key in ("num_conversations", "num_turns", "ttfet_p95_s", "slo_attainment", "tokens_per_joule", "energy_j"):
        assert logged["summary"][key] == pytest.approx(summary[key]), key
    assert logged["exit_code"] == 0
    assert logged["config"]["scheduler"]["name"] == "conserve"
    assert logged["config"]["engine"]["max_num_batched_tokens"] == 2048  # a token count, kept (conf/config.yaml)
    assert logged["config"]["backend"]["hf_token"] == "<redacted>"
    assert logged["config"]["logger"]["wandb_api_key"] == "<redacted>"
    series = [h for h in logged["history"] if "sim_time_s" in h]
    assert series and any("instance/decoder0/kv_used_frac" in h for h in series)
    media = {p.name.split("_")[0] for p in (rdir / "files" / "media").rglob("*") if p.is_file()}
    assert {"conversations", "turns", "instances", "ttfet", "kv"} <= media, media
    assert saved and set(saved) == {".png"}, saved
    assert all(logging.getLogger(n).getEffectiveLevel() == logging.WARNING for n in ("fontTools", "matplotlib"))
    assert_no_secret_in(wdir, out)


def test_wandb_run_is_closed_when_the_run_fails(monkeypatch, tmp_path: Path):
    pytest.importorskip("wandb")
    wdir = offline_env(monkeypatch, tmp_path)
    overrides = tiny_overrides("logger=wandb", "logger.log_figures=false")
    run = compose_run(overrides)
    out = tmp_path / "run"
    import harness.run.runner as runner

    def boom(*a, **k):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(runner, "run_session", boom)
    with pytest.raises(RuntimeError, match="simulated failure"):
        with logged_run(run.cfg.logger, out, config_with_secrets(overrides)):
            execute(run, out)
    logged = read_closed_run(offline_run_dir(wdir))
    assert logged["exit_code"] == 1
    assert "simulated failure" in logged["summary"]["error"]
    assert_no_secret_in(wdir)


def test_without_wandb_or_with_parquet_nothing_breaks(monkeypatch, tmp_path: Path):
    offline_env(monkeypatch, tmp_path)
    run = compose_run(tiny_overrides("logger=parquet"))
    assert isinstance(start_logger(run.cfg.logger, tmp_path, {}), NullLogger)
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    run = compose_run(tiny_overrides("logger=wandb"))
    out = tmp_path / "run"
    with logged_run(run.cfg.logger, out, {}) as logger:
        assert isinstance(logger, NullLogger)
        execute(run, out)
    assert (out / "turns.parquet").is_file() and (out / "summary.json").is_file()
    assert not (tmp_path / "wandb_dir").exists()


def test_secrets_are_scrubbed_by_value_whatever_the_key():
    """A credential in a value is redacted wherever it sits (a list after --api-key, a KEY=value string, a
    well-known token prefix), and token counts and units are left alone."""
    cfg = {"backend": {"extra_args": ["--api-key", "sk-abcdefghijklmnopqrstuvwx", "--max-model-len", "2048",
                                      "--hf-token=hf_abcdefghijklmnopqrstuvwxyz"]},
           "note": "see Bearer abcdef123456", "wandb_key": "x" * 3,
           "model": {"prompt_tokens": 5, "kv_bytes_per_token": 114688}, "path": "traces/a.jsonl.gz"}
    out = scrub(cfg)
    assert out["backend"]["extra_args"] == ["--api-key", "<redacted>", "--max-model-len", "2048",
                                            "--hf-token=<redacted>"]
    assert "abcdef123456" not in out["note"]
    assert out["model"] == cfg["model"] and out["path"] == cfg["path"]


def test_the_config_is_made_only_for_a_logger_that_records_it(monkeypatch, tmp_path: Path):
    """``start_logger``'s ``config`` may be a function (run.py passes the resolved container so): not called for a
    logger that records no config (``parquet``; W&B ``disabled``), called once for W&B, whose logger gets its dict."""
    from harness.run import loggers

    calls: list = []

    def make():
        calls.append(1)
        return {"scheduler": {"name": "conserve"}}

    offline_env(monkeypatch, tmp_path)
    assert isinstance(start_logger(compose_run(tiny_overrides("logger=parquet")).cfg.logger, tmp_path, make), NullLogger)
    lc = compose_run(tiny_overrides("logger=wandb", "logger.mode=disabled")).cfg.logger
    assert isinstance(start_logger(lc, tmp_path, make), NullLogger) and calls == []
    got: list = []
    monkeypatch.setitem(sys.modules, "wandb", sys.modules.get("wandb") or type(sys)("wandb"))
    monkeypatch.setattr(loggers, "WandbLogger", lambda lc, out, config: got.append(config) or NullLogger())
    start_logger(compose_run(tiny_overrides("logger=wandb")).cfg.logger, tmp_path, make)
    assert calls == [1] and got == [{"scheduler": {"name": "conserve"}}]
