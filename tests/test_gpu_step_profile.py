"""scripts/gpu_step_profile.py on CPU PyTorch: the tiny model on a tiny grid writes the two tables of
scripts/fit_step_model.py's layout, with the grid's rows and prefixes derived by hand."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from harness.run.config import PROJECT_ROOT
from tests.conftest import skip_without

skip_without("torch", "PyTorch not installed")   # the script imports it; collection does not (tests/conftest.py)


def test_tiny_model_grid_on_cpu(tmp_path):
    out = tmp_path / "prof"
    subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "gpu_step_profile.py"), "--model", "tiny",
                    "--label", "cpu", "--out", str(out), "--device", "cpu", "--tokens", "1,16", "--decode-batches",
                    "1,4", "--contexts", "64", "--chunks", "32", "--prefix-fracs", "0,0.5,0.75", "--repeats", "2"],
                   check=True, cwd=PROJECT_ROOT, timeout=300)
    mlp = pd.read_csv(out / "tiny_mlp_ms.csv")
    ref = pd.read_csv(PROJECT_ROOT / "docs" / "data" / "vidur_llama2_7b_mlp_ms.csv", nrows=1)
    assert list(mlp.columns) == list(ref.columns) and list(mlp.num_tokens) == [1, 16]
    att = pd.read_csv(out / "tiny_attention_ms.csv")
    ref = pd.read_csv(PROJECT_ROOT / "docs" / "data" / "vidur_llama2_7b_attention_ms.csv", nrows=1)
    assert list(att.columns) == list(ref.columns)
    pre = att[att.phase == "prefill"]
    # chunk 32 at cached fractions 0, 0.5, 0.75: prefixes p with p / (p + 32) = f -> 0, 32, 96 tokens
    assert list(pre.kv_cache_size) == [0, 32, 96] and (pre.prefill_chunk_size == 32).all()
    dec = att[att.phase == "decode"]
    assert list(zip(dec.batch_size, dec.kv_cache_size)) == [(1, 64), (4, 64)]
    assert (att.attn_ms > 0).all() and (mlp.drop(columns=["gpu", "num_tokens"]) > 0).all().all()


def test_bad_grid_is_refused_naming_the_option(tmp_path):
    r = subprocess.run([sys.executable, str(PROJECT_ROOT / "scripts" / "gpu_step_profile.py"), "--model", "tiny",
                        "--label", "cpu", "--out", str(tmp_path), "--prefix-fracs", "0,1.0"],
                       capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=120)
    assert r.returncode == 2 and "--prefix-fracs" in r.stderr
