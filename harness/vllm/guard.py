"""The guard of one launched server: it ties the server's whole process tree to the run that owns it.

``python harness/vllm/guard.py --owner PID [--grace S] [--poll S] -- COMMAND...`` (run by path: standard
library only, so it starts in ~50 ms and needs no ``PYTHONPATH``). :class:`harness.vllm.launcher.Launcher`
starts it as the leader of a new session (its pid is the session's and the process group's id); it starts
COMMAND (``vllm.entrypoints.openai.api_server``) as its child in that process group, so vLLM's engine core
(``VLLM::EngineCore``) and workers (``VLLM::Worker``), which the API server spawns and which inherit the
group, are in it too. The guard is a child subreaper (Linux ``prctl(PR_SET_CHILD_SUBREAPER)``): a descendant
orphaned by the API server's death is re-parented to the guard, not to init, so it stays findable even if
it left the group. The server gets ``PR_SET_PDEATHSIG`` = SIGKILL toward the guard.

Every ``--poll`` s (default 0.25 s) the guard checks that the owner (the harness process that launched it)
is still its parent (``getppid()``; a dead owner's children are re-parented). It stops the whole tree when

- the owner died (``kill -9`` of the harness: nothing else would stop vLLM's engine processes, which outlive
  their API server), or
- the guard got SIGTERM (the launcher's ``stop()`` sends it to the group), or
- the server exited by itself (its engine processes must not outlive it),

by SIGTERM to every process of the tree (the group plus every descendant), ``--grace`` s (default 5 s) for
them to exit, then SIGKILL to what is left. It exits with the server's status (``128 + n`` after signal n,
as a shell reports it), once no process of the tree is left. So ``kill -9`` of the harness leaves nothing
after ``poll + grace + 1`` s (< 7 s with the defaults; tests/test_launcher_guard.py, tests/test_vllm_real.py).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1        # linux/prctl.h
PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> bool:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid: int) -> tuple[int, int, str]:
    """``(ppid, pgrp, state)`` of process ``pid`` from ``/proc/<pid>/stat`` (``(0, 0, "")`` when gone)."""
    try:
        text = open(f"/proc/{pid}/stat", "rb").read().decode(errors="replace")
    except OSError:
        return 0, 0, ""
    fields = text[text.rindex(")") + 2:].split()   # the command name (field 2) may hold spaces and ')'
    return int(fields[1]), int(fields[2]), fields[0]


def tree(root: int) -> set[int]:
    """Live (not zombie) processes of ``root``'s tree other than ``root``: those in process group ``root``
    and every descendant of ``root`` (by parent pid), read from ``/proc``."""
    procs = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid, pgrp, state = _stat(int(name))
            if state and state != "Z":
                procs[int(name)] = (ppid, pgrp)
    out = {p for p, (_, g) in procs.items() if g == root}
    frontier = {root} | out
    while frontier:
        frontier = {p for p, (pp, _) in procs.items() if pp in frontier and p not in out}
        out |= frontier
    out.discard(root)
    return out


REAPED: dict[int, int] = {}   # pid -> exit code (negative: killed by that signal) of children reaped here


def _reap() -> None:
    """Collect every exited child (the server, and orphans re-parented to this subreaper) into ``REAPED``."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        REAPED[pid] = os.waitstatus_to_exitcode(status)


def stop_tree(root: int, grace_s: float) -> None:
    """SIGTERM every process of ``root``'s tree (:func:`tree`), wait up to ``grace_s`` s, then SIGKILL what
    is left, until nothing is left (a process forked meanwhile is found by the next pass)."""
    def send(sig: int, pids) -> None:
        for p in pids:
            try:
                os.kill(p, sig)
            except (ProcessLookupError, PermissionError):
                pass
    send(signal.SIGTERM, tree(root))
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        _reap()
        if not tree(root):
            return
        time.sleep(0.1)
    for _ in range(100):
        left = tree(root)
        if not left:
            return
        send(signal.SIGKILL, left)
        time.sleep(0.05)
        _reap()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--owner", type=int, required=True, help="pid of the process that owns the server")
    ap.add_argument("--grace", type=float, default=5.0, help="s between SIGTERM and SIGKILL (default 5)")
    ap.add_argument("--poll", type=float, default=0.25, help="s between checks of the owner (default 0.25)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- the server's command line")
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command after --")
    if os.getppid() != a.owner:    # the owner died before this guard ran: start nothing
        return 1
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stop = []
    # a handler, not SIG_IGN: handlers are reset across exec, so the server still gets SIGTERM's default
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    server = subprocess.Popen(cmd, preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGKILL))
    me = os.getpid()
    while server.poll() is None and not stop and os.getppid() == a.owner:
        time.sleep(a.poll)
    if server.poll() is None and not stop:
        print(f"guard {me}: owner pid {a.owner} is gone; stopping the server's process tree", file=sys.stderr,
              flush=True)
    stop_tree(me, a.grace)
    rc = server.returncode if server.returncode is not None else REAPED.get(server.pid)
    if rc is None:
        rc = server.wait()
    return 128 - rc if rc < 0 else rc


if __name__ == "__main__":
    sys.exit(main())
