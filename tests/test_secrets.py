"""Credentials given on the command line never reach a file under the run (or sweep) directory, and the files
that held one are mode 0600 (harness.run.cli, harness.run.runner, harness.run.loggers: one scrubbing rule,
the one W&B's config goes through).

The end-to-end tests run the real command line and then read every file under the directory, parquet included,
byte by byte, for the secret (as ``grep -r`` would): the sweep in a ``python run.py`` process (its jobs run in
the sweep executor's worker processes), the single runs through ``run.py``'s main in the test process
(:func:`tests.conftest.run_py_in_process`: what is checked is the files main writes and their modes, the same
code with the same umask; 0.8-1.4 CPU s each as a process, 2026-12-07)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.core.paths import PROJECT_ROOT
from harness.run.loggers import REDACTED, is_secret_key, scrub, scrub_yaml, secret_values
from tests.conftest import run_py_in_process

SECRET = "s3cr3t-Value-9d2c7e"
TINY = ["workload.num_conversations=3", "workload.max_turns=2", "logger.progress=false", "slo=absolute"]


def _run(args, tmp_path):
    env = {**os.environ, "HARNESS_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "run.py", *args], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)


def _run_here(args, tmp_path, monkeypatch, capsys):
    """:func:`_run`'s run of ``run.py``'s main in this process (:func:`tests.conftest.run_py_in_process`)."""
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    return run_py_in_process(args, monkeypatch, capsys)


def _holding(root: Path, needle: str) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle`` (``grep -rl``)."""
    return [str(p) for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


# ---- the rule -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key", ["api_key", "wandb_api_key", "HF_TOKEN", "authtoken", "access-token",
                                 "client_secret", "db_password", "PASSWORD"])
def test_names_ending_in_a_credential_word_are_secret(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["max_num_batched_tokens", "kv_bytes_per_token", "prompt_tokens", "tokenizer",
                                 "hf_name"])
def test_token_counts_and_names_are_not(key):
    assert not is_secret_key(key)


def test_scrub_yaml_redacts_values_and_their_other_occurrences_and_is_idempotent():
    text = (f"backend:\n  api_key: {SECRET}\n  extra_args: [--api-key, {SECRET}x, --enforce-eager]\n"
            f"  endpoints: ['http://bob:{SECRET}y@h:8000']\n  note: 'see {SECRET}'\n  ref: ${{backend.api_key}}\n"
            f"db:\n  password: 123456\n  hf_token: null\nworkload:\n  token_scale: 0.1\n")
    out = scrub_yaml(text)
    assert SECRET not in out and "123456" not in out
    d = yaml.safe_load(out)
    assert d["backend"]["api_key"] == REDACTED and d["backend"]["extra_args"] == ["--api-key", REDACTED,
                                                                                  "--enforce-eager"]
    assert d["backend"]["endpoints"] == [f"http://bob:{REDACTED}@h:8000"] and d["backend"]["note"] == f"see {REDACTED}"
    assert d["backend"]["ref"] == "${backend.api_key}"      # an interpolation is kept as written
    assert d["db"]["hf_token"] is None and d["workload"]["token_scale"] == 0.1    # no credential, a scale
    assert scrub_yaml(out) == out
    plain = "workload:\n  token_scale: 1.0e-3\n  name: x\n"  # nothing to redact: the very text back
    assert scrub_yaml(plain) is plain


def test_secret_values_feed_scrub_for_the_overrides_that_name_no_key():
    cfg = {"backend": {"extra_args": ["--api-key", SECRET]}}
    overrides = [f"backend.extra_args=[--api-key,{SECRET}]"]
    assert secret_values(cfg) == [SECRET]
    assert scrub(overrides, secret_values(cfg)) == [f"backend.extra_args=[--api-key,{REDACTED}]"]


# ---- the command line, end to end --------------------------------------------------------------------------

def test_a_sweep_given_credentials_writes_none_and_resumes(tmp_path):
    """A URL's password and an API-key header in W&B settings (accepted by the simulated run's config), in a
    one-job multirun: nothing under the sweep directory holds them; the files that held them are 0600; the
    same command again finds the job complete (the redacted config and overrides are its identity)."""
    sweep = tmp_path / "sweep"
    args = ["-m", *TINY, f"logger.group=https://bob:{SECRET}@tracker.example/x",
            f"logger.tags=['X-Api-Key: {SECRET}Z']", f"hydra.sweep.dir={sweep}"]
    r = _run(args, tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _holding(sweep, SECRET) == []
    (job,) = [p.parent for p in sweep.glob("*/summary.json")]
    for p in [job / "config.yaml", job / "meta.json", job / "run.log", job / ".hydra" / "config.yaml",
              job / ".hydra" / "hydra.yaml", job / ".hydra" / "overrides.yaml", sweep / "multirun.yaml"]:
        assert _mode(p) == 0o600, p
    assert REDACTED in (job / "config.yaml").read_text()
    assert (job / "turns.parquet").is_file()           # the run itself is whole
    again = _run(args, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already complete" in again.stdout + again.stderr
    assert _holding(sweep, SECRET) == []


def test_a_run_without_credentials_keeps_the_umask_mode(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    r = _run_here([*TINY, f"hydra.run.dir={out}"], tmp_path, monkeypatch, capsys)
    assert r.returncode == 0, r.stderr[-3000:]
    umask = os.umask(0)
    os.umask(umask)
    for name in ("config.yaml", "meta.json", "summary.json", ".hydra/overrides.yaml"):
        assert _mode(out / name) == 0o666 & ~umask, name
    assert REDACTED not in (out / "config.yaml").read_text()


def test_a_failed_real_backend_run_given_an_api_key_writes_none(tmp_path, monkeypatch, capsys):
    """``backend=vllm`` against no server (``launch=false``, an endpoint nobody answers): the API key in the
    servers' flags and the endpoint URL's password are in no file, though the run fails (exit 1) with an error
    that quotes the endpoint."""
    pytest.importorskip("aiohttp")
    out = tmp_path / "run"
    r = _run_here(["backend=vllm", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "engine.block_size=128",
              "workload.token_scale=0.05", "workload.num_conversations=2", "workload.max_turns=2",
              "logger.progress=false", "slo=absolute", "backend.launch=false", "backend.startup_timeout_s=2",
              f"backend.endpoints=[http://bob:{SECRET}@127.0.0.1:9]", f"backend.extra_args=[--api-key,{SECRET}K]",
              f"hydra.run.dir={out}"], tmp_path, monkeypatch, capsys)
    assert r.returncode == 1, r.stderr[-3000:]
    assert (out / "summary.json").is_file() and "127.0.0.1:9" in (out / "summary.json").read_text()
    assert _holding(out, SECRET) == []
    for name in ("config.yaml", "meta.json", "summary.json", ".hydra/overrides.yaml"):
        assert _mode(out / name) == 0o600, name


def test_a_refused_credential_override_leaves_no_copy(tmp_path, monkeypatch, capsys):
    """``+wandb.api_key=...`` is no key of the config (exit 2, the key named); the directory it named, which
    held a file of the user's (so it is not removed as empty), keeps no copy of the value in Hydra's files."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    r = _run_here([*TINY, f"+wandb.api_key={SECRET}", f"hydra.run.dir={out}"], tmp_path, monkeypatch, capsys)
    assert r.returncode == 2 and "wandb" in r.stderr, r.stderr[-3000:]
    assert (out / "notes.txt").is_file() and _holding(out, SECRET) == []
    assert _mode(out / ".hydra" / "overrides.yaml") == 0o600
