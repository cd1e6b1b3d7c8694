"""The tiny test model (``backend.model=tiny``, ``harness.vllm.tiny_model``) is built whole or not at all
(issue 50): a build killed midway leaves no directory a later run trusts, and of two concurrent builds one
wins while the other discards its copy, neither ever exposing a half-written model. Before, the model was
written in place with ``config.json`` as its "done" mark, which a build writes before the weights. The case runs
three build processes, forked from one parent that imported torch / transformers / tokenizers once (the imports
were about 10 of the ~15 s of CPU of each of three separate interpreters)."""

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

# The builds' parent: it imports torch, transformers and tokenizers once (about 10 s of CPU, most of a build), then
# forks one process per build on request (a line on stdin), each with its stdout and stderr in files; it reaps
# them (a killed build's pid is gone, as after a real process's death) and reports their exit status as
# subprocess does (-9: SIGKILL). A build (`die` / `wait`) is ``tiny_model.ensure`` with model.save_pretrained
# writing config.json (as transformers does, before the weights) and then either dying (``die``) or waiting
# for a go file before writing the rest (``wait``); `cli` is ``python -m harness.vllm.tiny_model OUT``'s main.
_PARENT = """
import os, signal, sys, time, traceback
from pathlib import Path
import torch, tokenizers, transformers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM
from harness.vllm import tiny_model


def held(target, mode, flag):
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


for line in sys.stdin:
    cmd, *args = line.rstrip("\\n").split("\\t")
    if cmd in ("wait_pid", "poll_pid"):
        pid, st = os.waitpid(int(args[0]), 0 if cmd == "wait_pid" else os.WNOHANG)
        print(os.waitstatus_to_exitcode(st) if pid else "running", flush=True)
        continue
    pid = os.fork()
    if pid == 0:
        for fd, name in ((1, args[-1] + ".out"), (2, args[-1] + ".err")):
            os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        code = 0
        try:
            if cmd == "cli":
                tiny_model.main([args[0]])
            else:
                held(Path(args[0]), cmd, Path(args[1]))
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
"""
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", tiny_model.MARKER)


class Builds:
    """The build processes of one test, forked by one parent process (:data:`_PARENT`)."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.parent = subprocess.Popen([sys.executable, "-c", _PARENT], cwd=PROJECT_ROOT, text=True,
                                       env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)), stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE)
        self.logs: dict[int, Path] = {}
        self.reaped: set[int] = set()
        self.status: dict[int, int] = {}

    def _ask(self, *words) -> str:
        self.parent.stdin.write("\t".join(map(str, words)) + "\n")
        self.parent.stdin.flush()
        answer = self.parent.stdout.readline()
        assert answer, f"the builds' parent exited {self.parent.wait()}"
        return answer.strip()

    def start(self, mode: str, target: Path, flag: Path | None = None) -> int:
        """Fork a build: ``die`` / ``wait`` (held at config.json on ``flag``) or ``cli``; its pid."""
        log = self.tmp / f"build-{len(self.logs)}"
        pid = int(self._ask(mode, target, *([flag] if flag is not None else []), log))
        self.logs[pid] = log
        return pid

    def poll(self, pid: int) -> int | None:
        """The build's exit status (subprocess's convention: -N for signal N), or None while it runs."""
        if pid in self.reaped:
            return self.status[pid]
        answer = self._ask("poll_pid", pid)
        if answer == "running":
            return None
        self.reaped.add(pid)
        self.status[pid] = int(answer)
        return self.status[pid]

    def wait(self, pid: int, timeout_s: float = 600) -> tuple[int, str, str]:
        """Wait for the build: ``(status, stdout, stderr)``."""
        end = time.monotonic() + timeout_s
        while (rc := self.poll(pid)) is None:
            assert time.monotonic() < end, f"build {pid} not done within {timeout_s:g} s"
            time.sleep(0.1)
        return rc, self.out(pid), self.err(pid)

    def out(self, pid: int) -> str:
        return self.logs[pid].with_suffix(".out").read_text()

    def err(self, pid: int) -> str:
        p = self.logs[pid].with_suffix(".err")
        return p.read_text() if p.exists() else ""

    def close(self) -> None:
        for pid in set(self.logs) - self.reaped:   # still running (a reaped pid may be another process's now)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.parent.stdin.close()
        try:
            self.parent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.parent.kill()
            self.parent.wait()


def _complete(d: Path) -> bool:
    return all((d / f).is_file() and (d / f).stat().st_size > 0 for f in FILES)


def _wait_for(path: Path, builds: Builds, pid: int, timeout_s: float = 600) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        assert builds.poll(pid) is None or path.exists(), builds.err(pid)[-3000:]
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
    builds = Builds(tmp_path)
    try:
        dead = builds.start("die", target, tmp_path / "dead" / "flag")
        assert builds.wait(dead)[0] == -signal.SIGKILL
        assert (tmp_path / "dead" / "flag").exists()    # it died after config.json, before the weights
        assert not target.exists()                      # nothing at the target: a later run builds
        left = list(target.parent.glob(".tiny.build-*"))
        assert len(left) == 1 and (left[0] / "config.json").is_file()   # its temporary directory, for now
        target.mkdir()
        (target / "config.json").write_text("{}")       # 2: config.json and nothing else
        a = builds.start("wait", target, tmp_path / "flag")
        _wait_for(tmp_path / "flag", builds, a)
        assert not target.exists() and not left[0].exists()   # moved aside, the dead build's directory removed
        b = builds.start("cli", target)                  # python -m harness.vllm.tiny_model TARGET
        b_rc, b_out, b_err = builds.wait(b)
        assert b_rc == 0, b_err[-3000:]
        assert b_out.strip() == str(target) and _complete(target)
        b_weights = (target / "model.safetensors").stat().st_ino
        (tmp_path / "go").write_text("")
        a_rc, out, err = builds.wait(a)
        assert a_rc == 0, err[-3000:]
    finally:
        builds.close()
    assert out.strip() == str(target) and _complete(target)
    assert (target / "model.safetensors").stat().st_ino == b_weights   # B's copy stayed, A's was discarded
    assert not list(target.parent.glob(".tiny.*"))
    assert tiny_model.ensure(target) == target      # complete: returned as is, nothing built
