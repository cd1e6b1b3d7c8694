"""A driver owns its children (issue 50): ``python -m harness.analysis.seeds`` stopped by SIGTERM, or killed by
SIGKILL, while its ``run.py -m`` child runs leaves no process of that child's group and no held sweep lock
(``harness.core.children``: a process group per child, stopped on SIGTERM / Ctrl-C; Linux's parent-death
signal for a driver that cannot clean up). Before, the child went on under pid 1 holding the lock. Each case
starts the real ``run.py`` on the default workload (about a minute and a half per seed here, far longer than
the test waits) and stops it as soon as it holds its sweep lock."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.core.children import die_with_parent, group_alive, run_owned
from harness.core.paths import PROJECT_ROOT


def _alive(pid: int) -> bool:
    """A live (not zombie) process ``pid``."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return False
    return text[text.rindex(")") + 2:].split()[0] != "Z"


def _lock_held(path: Path) -> bool:
    """Whether some process holds the ``flock`` of lock file ``path`` (False when there is no such file)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _wait(pred, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_seeds_driver_leaves_no_child_and_no_lock(tmp_path, sig):
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), HARNESS_CACHE_DIR="off")
    env.pop("HARNESS_TEST_INTERRUPT", None)
    driver = subprocess.Popen([sys.executable, "-m", "harness.analysis.seeds", str(tmp_path), "logger.progress=false",
                               "--cell", "c", "--a", "scheduler=conserve",
                               "--b", "scheduler=conserve workload.rate_per_s=0.04", "--metric", "ttfet_first_p95_s"],
                              cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              start_new_session=True)
    lock = tmp_path / "c" / ".sweep.lock"
    child = None
    try:
        def child_holds_lock() -> bool:
            nonlocal child
            try:
                child = int(json.loads(lock.read_text())["pid"])
            except (OSError, ValueError, KeyError):
                return False
            return child != driver.pid and _alive(child) and _lock_held(lock)
        _wait(lambda: child_holds_lock() or driver.poll() is not None, 300, "run.py's child took its sweep lock")
        assert driver.poll() is None, driver.stderr.read()[-3000:]
        os.kill(driver.pid, sig)
        driver.wait(timeout=120)
        if sig == signal.SIGTERM:   # the driver stopped its child before it exited
            assert not _alive(child) and not group_alive(child)
        else:                       # nothing could clean up: the parent-death signal stops the child
            _wait(lambda: not _alive(child), 60, f"child {child} ended after its driver was killed")
        # a multithreaded child's leader shows as a zombie while its other threads still exit holding the open
        # files (the flock goes with the last of them): give the teardown a few seconds, never a held lock
        _wait(lambda: not _lock_held(lock), 10, "the sweep lock released once the child was gone")
    finally:
        for pid in {driver.pid, child} - {None}:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_run_owned_forwards_ctrl_c_to_the_child_group_and_waits(tmp_path):
    """A Ctrl-C in the driver reaches the child (the child's group is its own, so only through the
    driver) and the driver waits for the child's own handler to finish before it goes on."""
    marker = tmp_path / "handled"
    child = ("import signal, sys, time, pathlib\n"
             "def h(*a):\n"
             f"    time.sleep(0.5); pathlib.Path({str(marker)!r}).write_text('SIGINT'); sys.exit(130)\n"
             "signal.signal(signal.SIGINT, h)\n"
             "print('ready', flush=True)\n"
             "time.sleep(120)\n")
    ready = tmp_path / "ready"
    # Ctrl-C's default action set here: a process started with SIGINT ignored (inherited: the suite's own worker
    # can carry it) never sees the Ctrl-C this test sends
    driver = ("import os, signal, sys, threading, time\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from harness.core.children import run_owned\n"
              "def ctrl_c():   # once the child has its handler (it printed 'ready'), not after a fixed wait\n"
              f"    while not (os.path.exists({str(ready)!r}) and open({str(ready)!r}).read()):\n"
              "        time.sleep(0.02)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "threading.Thread(target=ctrl_c, daemon=True).start()\n"
              "try:\n"
              f"    run_owned([sys.executable, '-c', {child!r}], stdout=open({str(ready)!r}, 'w'))\n"
              "except KeyboardInterrupt:\n"
              "    print('interrupted'); sys.exit(130)\n")
    r = subprocess.run([sys.executable, "-c", driver], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(PROJECT_ROOT)))
    assert r.returncode == 130 and r.stdout.strip() == "interrupted", r.stderr
    assert marker.read_text() == "SIGINT"   # the child's handler ran to its end before the driver exited


def test_die_with_parent_signals_at_once_when_the_parent_is_already_gone():
    """The race between fork and prctl: a child whose recorded parent is not its parent any more gets the
    signal at once (here: a parent pid that cannot be ours)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                         preexec_fn=lambda: die_with_parent(signal.SIGTERM, parent=1))
    assert p.wait(timeout=60) == -signal.SIGTERM


def test_run_owned_returns_like_subprocess_run():
    r = run_owned([sys.executable, "-c", "import os, sys; print(os.getpgid(0) == os.getpid()); sys.exit(3)"],
                  capture_output=True, text=True)
    assert r.returncode == 3 and r.stdout.strip() == "True"   # the leader of its own process group
