"""The tiny test model (``backend.model=tiny``, ``harness.vllm.tiny_model``) is built whole or not at all
(issue 50): a build killed midway leaves no directory a later run trusts, and of two concurrent builds one
wins while the other discards its copy, neither ever exposing a half-written model. Before, the model was
written in place with ``config.json`` as its "done" mark, which a build writes before the weights. Each case
runs three build processes (``tokenizers`` + ``transformers``; 1-3 min on the shared 2-core machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import skip_without  # noqa: E402

# without importing them (torch) at collection: the builds run in subprocesses
skip_without("transformers", "transformers not installed")
skip_without("tokenizers", "tokenizers not installed")

from harness.core.paths import PROJECT_ROOT
from harness.vllm import tiny_model

# A build whose model.save_pretrained writes config.json (as transformers does, before the weights) and then
# either dies (``die``) or waits for a go file before writing the rest (``wait``).
_PATCHED = """
import os, signal, sys, time
from pathlib import Path
import transformers
from harness.vllm import tiny_model
target, mode, flag = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
orig = transformers.PreTrainedModel.save_pretrained

def save(self, d, *a, **k):
    self.config.save_pretrained(d)
    flag.write_text(str(d))
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    while not (flag.parent / "go").exists():
        time.sleep(0.05)
    return orig(self, d, *a, **k)

transformers.PreTrainedModel.save_pretrained = save
print(tiny_model.ensure(target), flush=True)
"""
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", tiny_model.MARKER)


def _patched(target: Path, mode: str, flag: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _PATCHED, str(target), mode, str(flag)], cwd=PROJECT_ROOT,
                            env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _complete(d: Path) -> bool:
    return all((d / f).is_file() and (d / f).stat().st_size > 0 for f in FILES)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None or path.exists(), proc.stderr.read()[-3000:]
        assert time.monotonic() < end, f"{path} not written within {timeout_s:g} s"
        time.sleep(0.1)


def test_a_killed_build_leaves_nothing_trusted_and_of_two_concurrent_builds_one_wins(tmp_path):
    """1. A build killed after writing config.json (as transformers does, before the weights) leaves nothing at
    the target, only its temporary directory. 2. A directory without the marker at the target (a build before
    atomic builds) is not trusted. 3. Build A, held after writing config.json into its directory (which also
    cleans up 1 and moves 2 aside), while build B runs to the end and renames first; then A goes on, finds B's
    complete model and discards its own copy. Nobody looking while A is held sees a partial model."""
    target = tmp_path / "models" / "tiny"
    (tmp_path / "dead").mkdir()
    p = _patched(target, "die", tmp_path / "dead" / "flag")
    p.communicate(timeout=600)
    assert p.returncode == -signal.SIGKILL
    assert (tmp_path / "dead" / "flag").exists()    # it died after config.json, before the weights
    assert not target.exists()                      # nothing at the target: a later run builds
    left = list(target.parent.glob(".tiny.build-*"))
    assert len(left) == 1 and (left[0] / "config.json").is_file()   # its temporary directory, for now
    target.mkdir()
    (target / "config.json").write_text("{}")       # 2: config.json and nothing else
    a = _patched(target, "wait", tmp_path / "flag")
    try:
        _wait_for(tmp_path / "flag", a)
        assert not target.exists() and not left[0].exists()   # moved aside, the dead build's directory removed
        b = subprocess.run([sys.executable, "-m", "harness.vllm.tiny_model", str(target)], cwd=PROJECT_ROOT,
                           env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)), capture_output=True, text=True,
                           timeout=600)
        assert b.returncode == 0, b.stderr[-3000:]
        assert _complete(target)
        b_weights = (target / "model.safetensors").stat().st_ino
        (tmp_path / "go").write_text("")
        out, err = a.communicate(timeout=600)
        assert a.returncode == 0, err[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert out.strip() == str(target) and _complete(target)
    assert (target / "model.safetensors").stat().st_ino == b_weights   # B's copy stayed, A's was discarded
    assert not list(target.parent.glob(".tiny.*"))
    assert tiny_model.ensure(target) == target      # complete: returned as is, nothing built
