"""Child processes a driver owns: they never outlive it.

A driver -- ``harness.analysis.seeds``, which runs one ``python run.py -m`` per arm and round -- that is
stopped must stop its child too: a child left running under pid 1 keeps simulating (or keeps its vLLM servers
up) and holds its sweep directory's lock (``harness.analysis.provenance.DirLock``), so the next sweep there is
refused. :func:`run_owned` runs a command so that

* it leads a new process group (a new session, ``setsid``): the child and every process it starts in its
  group are signalled as one (``os.killpg``), and a Ctrl-C at the terminal reaches the driver only, which
  forwards it;
* it gets SIGTERM when the driver dies, however it dies (``kill -9`` included): Linux
  ``prctl(PR_SET_PDEATHSIG)`` (``linux/prctl.h``: option 1), set in the child between fork and exec through
  ``ctypes``; a driver that died before that took effect is seen by the child's parent pid having changed,
  and the child signals itself. (The signal follows the death of the *thread* that started the child:
  call :func:`run_owned` from a thread that outlives the child, the main thread in a driver.)
* while it runs, SIGTERM and SIGHUP to the driver raise :class:`Terminated` (a ``KeyboardInterrupt``, so the
  driver's Ctrl-C path ends it: exit 130) instead of killing it outright; on that or a Ctrl-C the child's
  group gets SIGINT (after a Ctrl-C) or SIGTERM (``run.py`` treats both alike: it writes what it measured, marks the job partial
  and releases its locks), :data:`GRACE_S` s to exit, then SIGKILL; a second signal in that time sends
  SIGKILL at once. Then the exception goes on up.

``harness.vllm.launcher`` starts its guards with :func:`die_with_parent` too (SIGKILL: the guard then
stops the server's tree).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import threading
from typing import Any, Optional, Sequence

PR_SET_PDEATHSIG = 1   # linux/prctl.h
try:   # loaded here, not in the forked child (no import or dlopen between fork and exec)
    _LIBC: Optional[ctypes.CDLL] = ctypes.CDLL("libc.so.6", use_errno=True)
    _LIBC.prctl   # noqa: B018 -- AttributeError where libc has no prctl
except (OSError, AttributeError):
    _LIBC = None
GRACE_S = 30.0         # s a signalled child group has to exit before SIGKILL: run.py writes its partial results
#                        and stops its servers (the guard's own grace is 5 s, harness.vllm.launcher.GUARD_GRACE_S)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP to a driver while it runs an owned child (:func:`run_owned`): raised like Ctrl-C's
    ``KeyboardInterrupt`` (a subclass), so the same path ends the driver; ``signum`` the signal."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"signal {signal.Signals(signum).name}")


def die_with_parent(sig: int = signal.SIGTERM, parent: Optional[int] = None, new_session: bool = True) -> None:
    """In a child between fork and exec (``subprocess.Popen(preexec_fn=...)``): a new session (its own process
    group) when ``new_session``, and signal ``sig`` when the parent dies (``prctl(PR_SET_PDEATHSIG, sig)``;
    a no-op where there is no such call). ``parent``: the parent's pid as it was before the fork; if the
    child's parent is already another process (the parent died before the prctl), ``sig`` is sent at once."""
    if new_session:
        os.setsid()
    if _LIBC is None:
        return
    _LIBC.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        # the parent's Python handler for ``sig`` (if it had one) is inherited by the fork until exec resets it;
        # the default action is what the parent-death signal would have done to the exec'd child
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Whether any process (not a zombie) is still in process group ``pgid`` (read from ``/proc``)."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            text = open(f"/proc/{d}/stat", "rb").read().decode(errors="replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()   # the command name (field 2) may hold spaces and ')'
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace_s: float = GRACE_S) -> None:
    """Stop the process group led by ``proc`` (started with :func:`die_with_parent`): ``sig`` to the group,
    up to ``grace_s`` s for its leader to exit (its pipes read meanwhile, so a child writing to them is not
    blocked), then SIGKILL to the group; SIGKILL at once on a second signal (a ``KeyboardInterrupt`` in the
    wait, re-raised). Whatever is left in the group after its leader exited gets SIGKILL too."""
    pgid = proc.pid
    _killpg(pgid, sig)
    try:
        proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    except BaseException:
        _killpg(pgid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        if proc.poll() is None:
            _killpg(pgid, signal.SIGKILL)
            proc.wait()
        if group_alive(pgid):
            _killpg(pgid, signal.SIGKILL)


def run_owned(cmd: Sequence[str], *, capture_output: bool = False, grace_s: float = GRACE_S,
              **popen_kw: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=..., **popen_kw)`` (``text``, ``cwd``, ``env``... as there) with the
    child owned by this process (module docstring): a new process group, SIGTERM at this process's death,
    and on Ctrl-C / SIGTERM / SIGHUP here the child's group stopped (:func:`stop_group`) before the exception
    goes on. Signal handlers are installed only when called from the main thread (Python's rule).

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT) while the child ran; :class:`Terminated`: SIGTERM or SIGHUP --
            each once the child's group is gone.
        OSError: the command cannot be started.
    """
    if capture_output:
        popen_kw["stdout"] = popen_kw["stderr"] = subprocess.PIPE
    main = threading.current_thread() is threading.main_thread()
    old = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)} if main else {}
    try:
        # Ctrl-C / SIGTERM / SIGHUP while the child is forked are held back (raised inside Popen they would leave
        # a started child that no one stops) and raised once ``proc`` exists, inside the ``try`` that stops it
        pending: list[int] = []
        held = {s: signal.signal(s, lambda signum, frame: pending.append(signum))
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)} if main else {}
        try:
            proc = subprocess.Popen(cmd, preexec_fn=functools.partial(die_with_parent, signal.SIGTERM, os.getpid()),
                                    **popen_kw)
        finally:
            for s, h in held.items():
                signal.signal(s, h)
        try:
            if pending:
                raise KeyboardInterrupt() if pending[0] == signal.SIGINT else Terminated(pending[0])
            out, err = proc.communicate()
        except BaseException as e:
            # Ctrl-C is passed on as SIGINT; SIGTERM, SIGHUP and anything else as SIGTERM (run.py's stop)
            stop_group(proc, signal.SIGINT if type(e) is KeyboardInterrupt else signal.SIGTERM, grace_s)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
