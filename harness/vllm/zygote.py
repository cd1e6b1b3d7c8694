"""A pre-imported vLLM server "zygote": one process that has imported vLLM's OpenAI API server (vLLM, torch,
transformers, FastAPI: ~8-10 CPU s, most of a CPU start-up of the tiny model) and forks a server on request, so
each server it starts skips those imports (a start-up of the tiny model ~3.4 instead of ~13 CPU s of the server's
process tree, docs/vllm_cpu.md, 2026-12-07). The server is the same vLLM code: the forked child runs the very module a
launch would run with ``python -m`` (``harness.vllm.api_server`` or ``vllm.entrypoints.openai.api_server``) with the
same arguments and environment, through ``runpy`` as ``python -m`` does; only its imports are already done.

``python -m harness.vllm.zygote --socket PATH [--owner PID]``: import, then listen on the Unix socket ``PATH``
(its directory should be private: anyone who can connect can start processes as this user). ``--owner``: the
zygote exits when that process (its parent) is gone; ``0`` (standalone, e.g. for a user's sweep) runs until
SIGTERM/SIGINT. A launcher uses it where given one (:class:`Zygote`, ``harness.vllm.launcher.Launcher``'s
``zygote``) or where :data:`ZYGOTE_ENV` names its socket.

The launcher's guarantees hold for a forked server as for an exec'd one (``harness/vllm/guard.py``): for each
request the zygote forks a *guard* that leads a new session and process group (its pid is the group's id, which the
launcher's record, ``stop()`` and ``stop_stale`` use), is a child subreaper, and forks the server in that group
(the server gets ``PR_SET_PDEATHSIG`` = SIGKILL toward the guard; its engine core and worker inherit the group).
The guard stops the whole tree (``guard.stop_tree``: SIGTERM, grace, SIGKILL) when the server exits, when it gets
SIGTERM, or when the *owner* (the launching process, named in the request with its start time) is gone: the
guard's parent is the zygote, not the owner, so it checks the owner's pid and start time (``/proc``) every poll
instead of ``getppid()``; a ``kill -9`` of the harness leaves nothing after ``poll + grace + 1`` s, as with the
exec'd guard. The zygote reaps each guard and tells the launcher its exit status over the request's connection
(:class:`ForkedGuard`: ``subprocess.Popen``'s ``pid`` / ``poll`` / ``wait`` / ``returncode``). The server's
``/proc/<pid>/cmdline`` shows its command line (``setproctitle``, as ``ps`` and ``pgrep -f`` would see an exec'd
server); its ``/proc/<pid>/environ`` is the zygote's (a forked process keeps its parent's), so a leftover is found
by its guard's process group (the record's ``pgid_start``), not by its token.

Imports read some environment variables once (``HF_HUB_OFFLINE``, vLLM's logging configuration, ``PYTHONPATH`` for
``sys.path``): a request whose environment differs from the zygote's in such a variable (:func:`import_env_mismatch`)
is refused, and the launcher starts that server the ordinary way. Linux only (``/proc``, ``prctl``).
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

ZYGOTE_ENV = "HARNESS_VLLM_ZYGOTE"   # the socket of a running zygote the launcher forks its CPU servers from
ZYGOTE_LINE = "harness.vllm.zygote: forked from the zygote"        # in a forked server's log (+ socket)
# the variables a forked server may have other than the zygote's: read at run time, not at import
# (VLLM_WORKER_MULTIPROC_METHOD: read when a process is started, and set by harness.vllm.api_server for its own;
# TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR: read, and set, when a compile asks for its cache directory: torch
# 2.13's torch/_inductor/runtime/cache_dir_utils.py cache_dir(), vLLM 0.32's compilation/compiler_interface.py
# initialize_cache; a test process of the in-process vLLM unit carried one, and its servers were exec'd for it in
# a CI run of 2026-12-07)
RUNTIME_KEYS = frozenset({"HARNESS_SERVER_TOKEN", "HARNESS_CPU_START_METHOD", "VLLM_CPU_OMP_THREADS_BIND",
                          "VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT", "VLLM_API_KEY",
                          "VLLM_WORKER_MULTIPROC_METHOD", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"})
# the variables that imports may read (compared between the zygote and a request, except RUNTIME_KEYS)
IMPORT_PREFIXES = ("VLLM_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TORCH", "PYTORCH_", "OMP_", "KMP_", "GOMP_",
                   "MKL_", "OPENBLAS_", "LD_", "PYTHON", "TOKENIZERS_", "CUDA_", "TRITON_", "XDG_", "HOME")
EXIT_UNKNOWN = 255   # a guard's exit status when the zygote that reaped it is gone before telling it
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"   # vLLM 0.32's server (harness.vllm.launcher's)
# what the zygote imports before it listens: vLLM's server, and what a CPU server imports later in its start-up (the
# API server's config check imports Ray, the engine core its executor and the CPU worker: py-spy over a forked
# start-up, 2026-12-07, 42 % of its samples in these imports); a start-up of the tiny model, CPU s of the server's
# tree, 3 alternated pairs at load 5.7-6.3: the server alone preloaded 4.54 / 3.90 / 4.54, with these 3.14 / 3.47 / 3.42
ZYGOTE_MODULE = "harness.vllm.zygote"   # what ``python -m`` runs (``__name__`` is ``__main__`` there)
MODULES = (VLLM_SERVER_MODULE, "ray", "vllm.v1.engine.async_llm", "vllm.v1.engine.core", "vllm.v1.executor",
           "vllm.v1.worker.cpu_worker", "vllm.v1.sample.rejection_sampler")


def import_env_mismatch(zygote_env: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """The variables (sorted) whose values differ between the zygote's environment ``zygote_env`` and a server's
    ``env`` (one absent from one side counts) among those imports may read (names starting with one of
    :data:`IMPORT_PREFIXES`), except :data:`RUNTIME_KEYS`; empty where the zygote can fork that server."""
    keys = {k for k in (*zygote_env, *env) if k.startswith(IMPORT_PREFIXES) and k not in RUNTIME_KEYS}
    return sorted(k for k in keys if zygote_env.get(k) != env.get(k))


def _start_ticks(pid: int) -> Optional[int]:
    """``/proc/<pid>/stat`` field 22 (start time, clock ticks since boot); None when gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def _title(argv: Sequence[str]) -> None:
    """Make ``/proc/self/cmdline`` read ``argv`` (``setproctitle``, vLLM's own dependency; nothing where absent)."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(" ".join(argv))


# ---- the launcher's side -------------------------------------------------------------------------------------------

class ForkedGuard:
    """What :class:`harness.vllm.launcher.Launcher` reads of a guard the zygote forked, as of a ``subprocess.Popen``:
    ``pid`` (the guard's, its process group's id), ``args``, ``returncode``, ``poll()``, ``wait(timeout)``. The exit
    status comes from the zygote, which reaps the guard (``os.waitstatus_to_exitcode``: negative for a signal, as
    ``Popen`` gives it); where the zygote is gone first, the guard is watched in ``/proc`` (its pid and start time)
    and its status, unknown, is :data:`EXIT_UNKNOWN`."""

    def __init__(self, conn: socket.socket, pid: int, start: Optional[int], args: Sequence[str]):
        self.conn, self.pid, self.start, self.args = conn, pid, start, list(args)
        self.returncode: Optional[int] = None
        self._buf = b""
        self._lost = False   # the zygote closed the connection without an exit status

    def _read(self, timeout: float) -> None:
        if self.returncode is not None:
            return
        if b"\n" in self._buf:
            self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["exit"])
            self.conn.close()
            return
        if not self._lost:
            self.conn.settimeout(max(0.0, timeout))
            try:
                data = self.conn.recv(4096)
            except (socket.timeout, BlockingIOError):
                return
            except OSError:
                data = b""
            if data:
                self._buf += data
                if b"\n" in self._buf:
                    self.returncode = int(json.loads(self._buf.split(b"\n", 1)[0])["exit"])
                    self.conn.close()
                return
            self._lost = True
            self.conn.close()
        if _start_ticks(self.pid) != self.start:
            self.returncode = EXIT_UNKNOWN
        elif timeout > 0:
            time.sleep(min(timeout, 0.1))

    def poll(self) -> Optional[int]:
        """The guard's exit status once it has exited, else None (does not block)."""
        self._read(0.0)
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for the guard to exit (at most ``timeout`` s; None: no limit); returns its exit status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._read(min(left, 1.0))
        return self.returncode


class Zygote:
    """A zygote's socket, as a launcher uses it: :meth:`spawn` starts one (owned by this process), ``Zygote(path)``
    attaches to a running one. ``env``: the zygote's environment (asked of it on first use)."""

    def __init__(self, path: str | os.PathLike, proc: Optional[subprocess.Popen] = None):
        self.path = str(path)
        self.proc = proc
        self._env: Optional[dict] = None

    @classmethod
    def spawn(cls, env: Mapping[str, str], workdir: str | os.PathLike, timeout_s: float = 600.0,
              preload: Sequence[str] = MODULES) -> "Zygote":
        """Start ``python -m harness.vllm.zygote`` with environment ``env`` (its ``zygote.log`` in ``workdir``, its
        socket in a private directory of its own, removed by :meth:`close`), importing ``preload`` (default
        :data:`MODULES`: vLLM's API server), owned by this process (it exits when this process is gone), and wait
        until it listens (its imports: ~9-17 CPU s; ``timeout_s`` s at most).

        Raises:
            RuntimeError: it exited or did not listen in time (with its log's tail).
        """
        from harness.core.children import die_with_parent
        import tempfile
        work = Path(workdir)
        work.mkdir(parents=True, exist_ok=True)
        # a short private directory of its own for the socket (a Unix socket's path has at most 107 bytes)
        path = Path(tempfile.mkdtemp(prefix="vllm-zygote-")) / "sock"
        log = open(work / "zygote.log", "w")
        me = os.getpid()
        try:
            proc = subprocess.Popen([sys.executable, "-m", ZYGOTE_MODULE, "--socket", str(path), "--owner", str(me),
                                     *(f"--preload={m}" for m in preload)],
                                    env=dict(env), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    preexec_fn=lambda: die_with_parent(signal.SIGKILL, me))
        finally:
            log.close()
        z = cls(path, proc)
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                z.close()
                tail = (work / "zygote.log").read_text(errors="replace").splitlines()[-15:]
                state = (f"exited with code {proc.returncode}" if proc.returncode is not None
                         else f"not listening after {timeout_s} s")
                raise RuntimeError(f"vLLM zygote {state}; last log lines:\n" + "\n".join(tail))
            try:
                z._env = z._ask({"op": "env"})["env"]
                return z
            except OSError:
                time.sleep(0.2)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.path)
        except OSError:
            s.close()
            raise
        return s

    @staticmethod
    def _line(s: socket.socket) -> tuple[dict, bytes]:
        """The first JSON line read from ``s``, and what was read after it."""
        buf = b""
        while b"\n" not in buf:
            data = s.recv(65536)
            if not data:
                raise ConnectionError("the zygote closed the connection")
            buf += data
        line, rest = buf.split(b"\n", 1)
        return json.loads(line), rest

    def _ask(self, req: dict) -> dict:
        with self._connect() as s:
            s.sendall(json.dumps(req).encode() + b"\n")
            return self._line(s)[0]

    @property
    def env(self) -> dict:
        """The zygote's environment (what its imports read)."""
        if self._env is None:
            self._env = self._ask({"op": "env"})["env"]
        return self._env

    def refusal(self, env: Mapping[str, str], device: Optional[str] = None) -> str:
        """Why a server with environment ``env`` (and ``device``, a GPU list or None) cannot be forked from this
        zygote (``""``: it can): a GPU server, a zygote not answering, or an import-time variable that differs
        (:func:`import_env_mismatch`)."""
        if device is not None:
            return "a GPU server (the zygote serves CPU servers)"
        try:
            diff = import_env_mismatch(self.env, env)
        except (OSError, ValueError, KeyError) as e:
            return f"the zygote at {self.path} does not answer ({e})"
        return f"its environment differs from the zygote's in {', '.join(diff)}" if diff else ""

    def launch(self, argv: Sequence[str], env: Mapping[str, str], log_fd: int, grace_s: float, poll_s: float = 0.25,
               cwd: Optional[str] = None) -> ForkedGuard:
        """Fork a guard and, under it, the server ``argv`` (``[python, -m, module, args...]``, as
        ``InstanceSpec.command()`` gives it), with environment ``env``, stdout and stderr on ``log_fd``, in ``cwd``
        (default: this process's), owned by this process (pid and start time); the guard stops the server's tree
        after ``grace_s`` s of SIGTERM and checks the owner every ``poll_s`` s.

        Raises:
            OSError: the zygote cannot be reached or refused (its reason).
        """
        if list(argv[1:2]) != ["-m"] or len(argv) < 3:
            raise OSError(f"the zygote runs python -m MODULE commands, not {list(argv)[:3]}")
        me = os.getpid()
        req = {"op": "launch", "module": argv[2], "argv": list(argv), "env": dict(env), "cwd": cwd or os.getcwd(),
               "owner": me, "owner_start": _start_ticks(me), "grace": grace_s, "poll": poll_s}
        s = self._connect()
        try:
            socket.send_fds(s, [json.dumps(req).encode() + b"\n"], [log_fd])
            rep, rest = self._line(s)
        except BaseException:
            s.close()
            raise
        if "error" in rep:
            s.close()
            raise OSError(f"the zygote refused: {rep['error']}")
        proc = ForkedGuard(s, int(rep["pid"]), rep.get("start"), argv)
        proc._buf = rest   # the exit status too, where the guard exited at once
        return proc

    def close(self) -> None:
        """Stop a zygote this process spawned (SIGTERM, then SIGKILL after 10 s); servers it forked are not touched
        (each guard answers to its own owner). Idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        Path(self.path).unlink(missing_ok=True)
        try:
            Path(self.path).parent.rmdir()
        except OSError:
            pass


def zygote_from_env() -> Optional[Zygote]:
    """The zygote :data:`ZYGOTE_ENV` names (its socket path), or None where unset."""
    path = os.environ.get(ZYGOTE_ENV)
    return Zygote(path) if path else None


# ---- the zygote's side ---------------------------------------------------------------------------------------------

def _guard(req: dict, log_fd: int) -> int:
    """In the guard the zygote forked for ``req`` (every other descriptor of the zygote closed): lead a new session,
    take ``log_fd`` as stdout and stderr, fork the server, and watch it, the owner and SIGTERM as
    ``harness/vllm/guard.py`` does. Returns the exit status (the server's, ``128 + n`` after signal n)."""
    from harness.vllm import guard
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    for fd in (devnull, log_fd):
        if fd > 2:
            os.close(fd)
    os.chdir(req["cwd"])
    signal.signal(signal.SIGINT, signal.default_int_handler)   # as in a fresh interpreter (the zygote's is its own)
    changed, removed = import_changes()
    os.environ.clear()
    os.environ.update(req["env"])
    os.environ.update(changed)
    for k in removed:
        os.environ.pop(k, None)
    owner, owner_start = int(req["owner"]), req.get("owner_start")
    me = os.getpid()

    def owner_alive() -> bool:
        now = _start_ticks(owner)
        return now is not None and (owner_start is None or now == owner_start)
    argv = [str(a) for a in req["argv"]]
    _title([argv[0], "-m", ZYGOTE_MODULE, "guard", "--owner", str(owner), "--", *argv])
    if not owner_alive():      # the owner died before this guard ran: start nothing
        return 1
    guard._prctl(guard.PR_SET_CHILD_SUBREAPER, 1)
    stop: list = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.append(signum))
    server = os.fork()
    if server == 0:
        code = 1
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            guard._prctl(guard.PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != me:
                os._exit(1)
            code = _serve(req["module"], argv)
        finally:
            os._exit(code)
    while not stop and owner_alive():
        guard._reap()
        if server in guard.REAPED:
            break
        time.sleep(float(req.get("poll", 0.25)))
    if server not in guard.REAPED and not stop:
        print(f"guard {me}: owner pid {owner} is gone; stopping the server's process tree", file=sys.stderr,
              flush=True)
    guard.stop_tree(me, float(req.get("grace", 5.0)))
    rc = guard.REAPED.get(server)
    if rc is None:
        rc = os.waitstatus_to_exitcode(os.waitpid(server, 0)[1])
    return 128 - rc if rc < 0 else rc


def _serve(module: str, argv: list[str]) -> int:
    """In the forked server: run ``module`` as ``python -m module argv[3:]`` would (``runpy``, ``sys.argv``), its
    command line shown as ``argv``; then what an interpreter does at exit (non-daemon threads joined, ``atexit``
    handlers run, output flushed). Returns the exit status."""
    import atexit
    import runpy
    import threading
    import traceback
    _title(argv)
    print(f"{ZYGOTE_LINE} (pid {os.getpid()}, zygote pid {_zygote_pid[0]})", file=sys.stderr, flush=True)
    sys.argv = [module, *argv[3:]]
    for m in (module, VLLM_SERVER_MODULE):   # as in a fresh ``python -m``: what runs as __main__ is not imported yet
        sys.modules.pop(m, None)
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:   # an interpreter dies of the SIGINT then: its parent sees 128 + 2, as here
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except (OSError, ValueError):
                pass
    return code


_zygote_pid: list[int] = [0]
_before_imports: dict[str, str] = {}   # the zygote's environment before its imports (which set some variables)


def import_changes() -> tuple[dict[str, str], list[str]]:
    """What the zygote's imports did to its environment: ``(set, removed)``, the variables they set or changed
    (vLLM and torch set e.g. ``LD_LIBRARY_PATH``, ``TORCHINDUCTOR_*``) and those they removed; a forked server's
    environment is the request's with these applied, as an exec'd server's imports would apply them."""
    return ({k: v for k, v in os.environ.items() if _before_imports.get(k) != v},
            [k for k in _before_imports if k not in os.environ])


def serve(path: str, owner: int, preload: Sequence[str] = MODULES) -> int:
    """The zygote: import ``preload`` (default :data:`MODULES`), listen on ``path``, and fork a guard per launch
    request (:func:`_guard`), until the owner (``owner``, its parent; 0: none) is gone or SIGTERM/SIGINT. Requests
    (one JSON line each, on a connection of their own): ``{"op": "env"}`` -> ``{"env": ...}``; ``{"op": "launch",
    ...}`` with the log's descriptor attached -> ``{"pid", "start"}`` of the guard, then ``{"exit": status}`` when
    it has exited. Returns 0."""
    import importlib
    # setproctitle's first call takes the memory of argv and the environment for titles, which it cannot once
    # the environment was rewritten (a guard replaces it): done here, so guards and servers can show theirs
    _title([sys.executable, "-m", ZYGOTE_MODULE, *sys.argv[1:]])
    _before_imports.update(os.environ)
    for m in preload:
        try:
            importlib.import_module(m)
        except ImportError as e:   # (Ray is an extra) a module not installed is imported by no server either
            print(f"harness.vllm.zygote: {m} not preloaded: {e}", flush=True)
    for m in ("harness.vllm.api_server", "harness.vllm.guard"):   # what a fork-mode server and its guard run
        importlib.import_module(m)
    from harness.vllm import guard   # (imported just above) its _reap collects the exited guards
    _zygote_pid[0] = os.getpid()
    stopping: list = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.append(signum))
    Path(path).unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(16)
    print(f"harness.vllm.zygote: pid {os.getpid()} listening on {path} ({len(sys.modules)} modules imported)",
          flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    guards: dict[int, socket.socket] = {}
    while not stopping and (owner == 0 or os.getppid() == owner):
        for _key, _ in sel.select(timeout=0.25):
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                _handle(conn, listener, sel, guards)
            except Exception as e:   # a bad request: told, and the zygote goes on
                try:
                    conn.sendall(json.dumps({"error": repr(e)}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
        guard._reap()   # the exited guards' statuses (guard.REAPED), each told to its launcher and dropped
        for pid in list(guard.REAPED):
            code = guard.REAPED.pop(pid)
            conn = guards.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()
    listener.close()
    Path(path).unlink(missing_ok=True)
    return 0


def _handle(conn: socket.socket, listener: socket.socket, sel, guards: dict) -> None:
    """One request on ``conn`` (:func:`serve`)."""
    conn.settimeout(30)
    msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 4)
    while not msg.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            raise ConnectionError("request cut short")
        msg += more
    req = json.loads(msg)
    if req.get("op") == "env":   # as it was before the imports: what an exec'd server would start with
        conn.sendall(json.dumps({"env": dict(_before_imports)}).encode() + b"\n")
        conn.close()
        return
    if req.get("op") != "launch" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"unknown request {req.get('op')!r} or no log descriptor")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            sel.close()
            listener.close()
            conn.close()
            for c in guards.values():
                c.close()
            code = _guard(req, fds[0])
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(fds[0])
    guards[pid] = conn
    conn.sendall(json.dumps({"pid": pid, "start": _start_ticks(pid)}).encode() + b"\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True, help="the Unix socket to listen on (in a private directory)")
    ap.add_argument("--owner", type=int, default=0, help="exit when this process (the parent) is gone; 0: never")
    ap.add_argument("--preload", action="append",
                    help=f"a module to import first (repeatable; default {', '.join(MODULES)})")
    a = ap.parse_args(argv)
    if a.owner and os.getppid() != a.owner:
        return 1
    return serve(a.socket, a.owner, a.preload or MODULES)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter teardown: the zygote holds nothing to write, and tearing down vLLM's and torch's ~5,600
    # modules (their atexit handlers, the collection of their objects) took ~4 s at every test session's end
    os._exit(code)
