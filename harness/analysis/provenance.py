"""What a result depends on, and who may write a results directory: fingerprints and directory locks.

**Fingerprint** (``meta.json["fingerprint"]``, written by ``harness.run.runner.execute``): a digest per
component of everything a run's result depends on, and one digest over them all:

* ``config``: the resolved config text (``config.yaml``; it holds the hardware and model profiles' values);
* ``profiles``: the run's hardware profiles (one per instance) and model profile, as the run uses them
  (``dataclasses.asdict``), so a profile edit is named as such;
* ``trace``: the trace file's *content* (SHA-256 of its bytes; ``synthetic`` for a synthetic workload), so a
  trace rewritten in place is seen even when its path and config are unchanged;
* ``code``: the source of every ``.py`` under ``harness/`` and ``baselines/`` (``harness.core.paths.code_digest``,
  the same digest that keys the unloaded-TTFET cache). A source digest rather than the git sha: it sees an
  uncommitted edit, works outside a git checkout, and two shas with the same harness code agree. The git
  sha and dirty flag are still recorded beside it (``meta.json["code"]``) for people.

Resume (``harness.run.runner.completed_run``) skips a job only when its directory holds a complete run with the
same job identity (its Hydra overrides) and the same fingerprint; otherwise the job is recomputed and the log
names the components that changed. ``harness.analysis.report`` and the sweep's ``comparison.md`` flag a sweep whose
runs mix code or trace fingerprints (:func:`mixed_components`).

**Locks** (:class:`DirLock`): one lock file per sweep directory (``.sweep.lock``, taken by the process that
launches the sweep, before any job runs) and per run directory (``.run.lock``, taken by the job). The lock
is an ``fcntl.flock`` on the file, so the operating system releases it when its holder dies, however it
dies; the file's text names the holder (pid, host, start time, command). A second sweep into a locked
directory *refuses* (:class:`LockHeld`, exit status 2) rather than waits: waiting would silently run the
second sweep's jobs after the first's into a directory whose comparison the user believes is theirs, and
a sweep's duration (hours) is no sensible wait. A lock file whose holder is gone (no ``flock`` held) is taken
over and the takeover is logged with the dead holder's pid and host. On a filesystem without ``flock``
(some NFS mounts), a holder on the same host is checked by pid; one on another host is refused (delete the
lock file by hand once that sweep is gone). ``scripts/wait_table.py`` holds one on its ``--out``
(``.wait_table.lock``) and fingerprints each row of its ``runs.csv`` with these digests.
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import hashlib
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.core.profiles import HardwareConfig, ModelConfig

log = logging.getLogger(__name__)

SWEEP_LOCK = ".sweep.lock"
RUN_LOCK = ".run.lock"
COMPONENTS = ("config", "profiles", "trace", "code")
# Components whose mix within one sweep makes a comparison meaningless (config and profiles differ by design
# between a sweep's jobs; code and the content of a given trace must not).
MIX_CHECKED = ("code", "trace")


def sha256_text(text: str) -> str:
    """SHA-256 of ``text`` (UTF-8), hex, first 32 characters (128 bits)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


_FILE_DIGESTS: dict[tuple, str] = {}


def file_digest(path: Path | str) -> str:
    """SHA-256 of a file's bytes, hex, first 32 characters; read in 1 MiB chunks (bounded memory), memoised per
    process by ``(path, size, mtime_ns, inode)``.

    Raises:
        OSError: the file cannot be read.
    """
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino)
    hit = _FILE_DIGESTS.get(key)
    if hit is None:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        hit = _FILE_DIGESTS[key] = h.hexdigest()[:32]
    return hit


@dataclasses.dataclass(frozen=True)
class FingerprintInput:
    """What a run's fingerprint reads of the run (built by ``harness.run.config.fingerprint_input`` from the
    resolved config, ``harness.run.config.Resolved``).

    instances: ``(name, role, HardwareConfig)`` per instance, in index order (``cluster.instances`` expanded);
    model: the served model's profile (``model``); trace_path: the trace file (absolute path), ``None`` for
    a synthetic workload (``workload.kind=synthetic``).
    """

    instances: tuple[tuple[str, str, HardwareConfig], ...]
    model: ModelConfig
    trace_path: Optional[Path]


def fingerprint(inp: FingerprintInput, resolved_yaml: str) -> dict:
    """The fingerprint of a resolved run (``inp``: what it reads of it) with config text ``resolved_yaml``:
    ``{"digest": ..., "components": {"config", "profiles", "trace", "code"}, "trace_path": ...}`` (module
    docstring). A trace that cannot be read gets ``unreadable`` (the run then fails on it with a clear error)."""
    from harness.core.paths import code_digest
    synthetic = inp.trace_path is None
    if synthetic:
        trace = "synthetic"
    else:
        try:
            trace = file_digest(inp.trace_path)
        except OSError:
            trace = "unreadable"
    profiles = json.dumps({"instances": [[n, r, dataclasses.asdict(h)] for n, r, h in inp.instances],
                           "model": dataclasses.asdict(inp.model)}, sort_keys=True, default=str)
    comp = {"config": sha256_text(resolved_yaml), "profiles": sha256_text(profiles), "trace": trace,
            "code": code_digest()}
    return {"digest": sha256_text(json.dumps(comp, sort_keys=True)), "components": comp,
            "trace_path": None if synthetic else str(inp.trace_path)}


def changed_components(old: Optional[dict], new: dict) -> list[str]:
    """The components of fingerprint ``new`` that differ from ``old`` (``["no fingerprint recorded"]`` when
    ``old`` is missing: a run written before fingerprints, never trusted), each as ``"<name> (<old> -> <new>)"``
    with the digests' first 12 characters."""
    if not isinstance(old, dict) or not isinstance(old.get("components"), dict):
        return ["no fingerprint recorded (a run written before fingerprints)"]
    o, n = old["components"], new["components"]
    return [f"{k} ({str(o.get(k))[:12]} -> {str(n.get(k))[:12]})" for k in COMPONENTS if o.get(k) != n.get(k)]


def mixed_components(fingerprints: Sequence[Optional[dict]]) -> dict[str, int]:
    """Which comparison-breaking components are mixed among a sweep's runs: ``{component: number of distinct
    digests}`` for ``code`` (one digest over all runs expected) and ``trace`` (one digest per trace path
    expected: a sweep over traces is fine, one path with two contents is not); ``fingerprint`` counts runs
    with no fingerprint when others have one. Empty: nothing mixed."""
    fps = [f for f in fingerprints if isinstance(f, dict) and isinstance(f.get("components"), dict)]
    out: dict[str, int] = {}
    missing = len(fingerprints) - len(fps)
    if fps and missing:
        out["fingerprint"] = missing
    codes = {f["components"].get("code") for f in fps}
    if len(codes) > 1:
        out["code"] = len(codes)
    by_path: dict[Any, set] = {}
    for f in fps:
        by_path.setdefault(f.get("trace_path"), set()).add(f["components"].get("trace"))
    worst = max((len(v) for v in by_path.values()), default=0)
    if worst > 1:
        out["trace"] = worst
    return out


def read_fingerprint(run_dir: Path) -> Optional[dict]:
    """``meta.json["fingerprint"]`` of a run directory, or None (no meta.json, unreadable, or none recorded)."""
    try:
        fp = json.loads((Path(run_dir) / "meta.json").read_text()).get("fingerprint")
    except (OSError, ValueError, AttributeError):
        return None
    return fp if isinstance(fp, dict) else None


def mixed_warning(mixed: dict[str, int]) -> str:
    """One sentence saying what is mixed (for ``report.md`` and ``comparison.md``); ``""`` when nothing is."""
    if not mixed:
        return ""
    parts = []
    if "code" in mixed:
        parts.append(f"{mixed['code']} different code versions")
    if "trace" in mixed:
        parts.append(f"{mixed['trace']} different contents of one trace file")
    if "fingerprint" in mixed:
        parts.append(f"{mixed['fingerprint']} runs without a fingerprint")
    return ("WARNING: this sweep mixes results that are not comparable: " + ", ".join(parts)
            + " (meta.json fingerprint; column `mixed` of runs.csv). Re-run the sweep into a fresh directory.")


# ---- locks -------------------------------------------------------------------------------------------


LOCK_ADVICE = "choose another directory (hydra.sweep.dir / hydra.run.dir)"


class LockHeld(RuntimeError):
    """Another live process holds the directory's lock; ``holder`` is its record (pid, host, since, argv).
    ``advice``: how to pick another directory (default :data:`LOCK_ADVICE`, run.py's; a tool names its flag)."""

    def __init__(self, path: Path, holder: dict, advice: str = LOCK_ADVICE):
        self.path, self.holder = path, holder
        since = holder.get("since", "?")
        super().__init__(f"{path.parent} is in use by another run: pid {holder.get('pid', '?')} on host "
                         f"{holder.get('host', '?')} since {since} ({' '.join(holder.get('argv', []))[:200]}); "
                         f"wait for it to end or {advice}")


def _holder_record() -> dict:
    from harness.core.redact import scrub   # the command line may carry a credential (an override)
    return {"pid": os.getpid(), "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": scrub(list(sys.argv))}


def _pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError) as e:
        return isinstance(e, PermissionError)
    return True


class DirLock:
    """An exclusive lock on a directory (module docstring): ``DirLock(dir, name).acquire()`` then ``release()``
    (also at interpreter exit). Re-acquiring a lock this process holds is a no-op. ``advice``: the end of the
    :class:`LockHeld` message (how to choose another directory).

    Raises (``acquire``):
        LockHeld: another live process holds it.
    """

    _held: dict[str, "DirLock"] = {}

    def __init__(self, directory: Path | str, name: str = SWEEP_LOCK, advice: str = LOCK_ADVICE):
        self.path = Path(directory) / name
        self.advice = advice
        self.fd: Optional[int] = None
        self.took_over: Optional[dict] = None

    def acquire(self) -> "DirLock":
        key = str(self.path.resolve()) if self.path.parent.exists() else str(self.path)
        if key in DirLock._held:
            return DirLock._held[key]
        self.created = not self.path.parent.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            import fcntl
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                flock_ok = True
            except BlockingIOError:
                raise LockHeld(self.path, self._read(fd), self.advice) from None
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                flock_ok = False
            prev = self._read(fd)
            if prev and not flock_ok:  # no flock on this filesystem: judge the holder by its pid
                if prev.get("host") != socket.gethostname() or _pid_alive(prev.get("pid")):
                    raise LockHeld(self.path, prev, self.advice)
            if prev:
                self.took_over = prev
                msg = (f"{self.path}: taking over the stale lock of pid {prev.get('pid', '?')} on host "
                       f"{prev.get('host', '?')} (since {prev.get('since', '?')}): that process is gone")
                log.warning(msg)
                print(f"warning: {msg}", file=sys.stderr, flush=True)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_holder_record()).encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        DirLock._held[key] = self
        self._key = key
        atexit.register(self.release)
        return self

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            raw = os.pread(fd, 65536, 0)
            d = json.loads(raw.decode()) if raw.strip() else {}
            return d if isinstance(d, dict) else {"text": str(d)}
        except (OSError, ValueError, UnicodeDecodeError):
            return {"text": "unreadable lock record"}

    def release(self) -> None:
        """Drop the lock and remove its file, and the directory when the lock created it and nothing else was
        written there (a sweep refused by its validation leaves no directory); idempotent."""
        if self.fd is None:
            return
        try:
            self.path.unlink()
            if self.created:
                self.path.parent.rmdir()   # only if empty
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None
        DirLock._held.pop(getattr(self, "_key", ""), None)
        atexit.unregister(self.release)   # (a sweep's process takes a lock per job: none kept past its release)
