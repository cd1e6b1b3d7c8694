"""The relative SLO's denominator: each conversation's unloaded TTFET, replayed alone on the idle simulated
cluster under the SLO's reference scheduler (``harness.run.session.reference_policy``), with its caches: an
in-process memo and checksummed on-disk shards shared by every job of a sweep (``$HARNESS_CACHE_DIR``).

``harness.run.runner.execute`` calls :func:`unloaded_readings` before the run when the SLO is relative (and for
the SLO-scale curve's reference); each replay is a ``harness.run.session.simulate`` session of the run's
:class:`harness.run.session.SessionInput`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from harness.core.paths import code_digest
from harness.run.session import SessionInput, reference_policy, simulate
from harness.core.trace import ConversationRecord
from harness.workload.workload import WorkloadStats

log = logging.getLogger(__name__)


def unloaded_readings(inp: SessionInput, conversations: Sequence[tuple[float, ConversationRecord]],
                      stats: WorkloadStats, *, cache_dir: Optional[Path | str] = None,
                      reference: Optional[str] = None) -> dict[str, dict[str, float]]:
    """Each conversation replayed alone (arrival at 0) on the idle simulated cluster under the SLO's
    reference scheduler (``harness.run.session.reference_policy``; ``reference`` overrides ``slo.reference_scheduler``):
    ``{conversation_id: {"first": s, "visible": s,
    "last": s, "serving": s}}``, the first-token time of turn 0, of the first user-visible turn and of the last turn
    (= that reading's unloaded TTFET, s), and the visible reading's time in the serving system
    (``harness.analysis.metrics.serving_ttfet``: the unloaded serving-only TTFET, s). A session per conversation, memoised in-process and on disk.

    The disk cache (``cache_dir``, default :func:`cache_root`: ``$HARNESS_CACHE_DIR`` or
    ``results/cache``; ``""`` or ``off``: none) holds ``unloaded_ttfet/<setup digest>/*.json``: shards of
    ``{"schema", "setup", "checksum", "values": {conversation digest: {reading: s or null}}}``
    (:func:`shard_problem`; the checksum is keyed on the setup digest, :func:`_shard_checksum`; a shard that
    fails its schema, setup or checksum is ignored with a warning and its conversations replayed),
    one written (atomically) per process that replayed something, read by every later job, so a sweep (local, or on machines sharing the directory: Slurm,
    Ray) replays each distinct conversation once per setup; jobs that start together on one setup replay each
    conversation once too: the first to miss holds the setup's lock (:func:`claim_setup`) until its shard is
    written, the others replay what it did not claim, then wait for it and read its shard. The setup digest covers what a replay depends
    on (:func:`_unloaded_cache_key`) and the code (``harness.core.paths.code_digest``: every ``.py`` under
    ``harness/`` and ``baselines/``),
    so a code change never reads stale numbers. Values round-trip exactly (JSON floats keep ``repr``).

    Raises:
        RuntimeError: an unloaded replay failed.
        BaselineInterrupted: Ctrl-C / SIGTERM (a ``KeyboardInterrupt``) during the replays; it carries the
            readings measured so far, which are also written to the disk cache.
    """
    from harness.analysis.metrics import serving_ttfet, ttfet_turn_index
    name, ref = reference_policy(inp, reference)
    key = _unloaded_cache_key(inp, stats, name, ref)
    vals: list[Optional[dict[str, float]]] = [None] * len(conversations)   # per conversation, in order
    fresh: dict[str, dict[str, Optional[float]]] = {}
    hook = _interrupt_hook("baseline")
    disk: Optional[_DiskCache] = None   # opened at the first in-process miss (a sweep's later jobs never read it)
    lock_fd: Optional[int] = None

    def readings() -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for (_, rec), v in zip(conversations, vals):
            if v is not None:
                out[rec.conversation_id] = v
        return out

    def from_cache(todo: list) -> list:
        """Fill ``vals`` from the in-process memo, else the disk shards; the ``(k, rec)`` still missing."""
        left = []
        for k, rec in todo:
            hit = _UNLOADED_CACHE.get((key, rec.turns))
            if hit is None and disk is not None:
                hit = disk.get(rec.turns)
                if hit is not None:
                    _UNLOADED_CACHE[(key, rec.turns)] = hit
            if hit is None:
                left.append((k, rec))
            else:
                vals[k] = dict(hit)
        return left

    def replay(todo: list) -> None:
        for k, rec in todo:
            if hook is not None and k >= hook[0] and os.environ.pop("HARNESS_TEST_INTERRUPT", None) is not None:
                os.kill(os.getpid(), hook[1])  # test-only fault injection (HARNESS_TEST_INTERRUPT), once per process
            hit = _UNLOADED_CACHE.get((key, rec.turns))   # the same turns twice in one workload: replayed once
            if hit is not None:
                vals[k] = dict(hit)
                continue
            res = simulate(inp, [(0.0, rec)], stats, name, ref, max_coalesce_s=math.inf)
            if res.error.startswith("KeyboardInterrupt"):  # run_session keeps an interrupt as an error: re-raise
                raise KeyboardInterrupt(res.error.partition(": ")[2])
            if res.error:
                raise RuntimeError(f"unloaded replay of {rec.conversation_id} failed: {res.error}")
            first = {r["turn"]: r["first_token_s"] for r in res.turns if r["status"] == "ok"}
            visible = [t.visible for t in rec.turns]
            val = {d: float(first.get(ttfet_turn_index(visible, d), math.nan)) for d in ("first", "visible", "last")}
            val["serving"] = serving_ttfet({r["turn"]: (r["submit_s"], r["first_token_s"], r["finish_s"])
                                            for r in res.turns if r["status"] == "ok"},
                                           ttfet_turn_index(visible, "visible"))
            vals[k] = val
            if disk is not None:
                _progress(lock_fd, disk.dir)
            if len(_UNLOADED_CACHE) >= _UNLOADED_CACHE_MAX:
                _UNLOADED_CACHE.clear()
            _UNLOADED_CACHE[(key, rec.turns)] = tuple(val.items())
            fresh[_digest(repr(rec.turns))] = {d: (None if math.isnan(v) else v) for d, v in val.items()}

    try:
        todo = from_cache([(k, rec) for k, (_, rec) in enumerate(conversations)])
        if todo:
            disk = _DiskCache(cache_dir, key)
            todo = from_cache(todo)
        if todo and disk.dir is not None:
            # Another process replaying this setup holds its lock and names the conversations it claimed:
            # replay the others meanwhile, then wait for it and read its shard for the claimed ones.
            lock_fd, claimed = claim_setup(disk.dir, [_digest(repr(rec.turns)) for _, rec in todo])
            if lock_fd is not None:   # a shard written between our read and the lock is read too
                disk = _DiskCache(cache_dir, key)
                todo = from_cache(todo)
            elif claimed is not None:
                replay([(k, rec) for k, rec in todo if _digest(repr(rec.turns)) not in claimed])
                todo = [(k, rec) for k, rec in todo if vals[k] is None]
                if todo:
                    lock_fd = setup_lock(disk.dir, [_digest(repr(rec.turns)) for _, rec in todo])
                    disk = _DiskCache(cache_dir, key)
                    todo = from_cache(todo)
        replay(todo)
    except KeyboardInterrupt as e:
        raise BaselineInterrupted(str(e) or "Ctrl-C", readings(), len(conversations)) from e
    finally:
        try:
            if disk is not None:
                disk.add(fresh)  # what was replayed before an interrupt or a failure is kept for the next run
        finally:
            if lock_fd is not None:
                os.close(lock_fd)   # releases the setup's lock: a process waiting on it now reads our shard
    return readings()


class BaselineInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM during the SLO baseline (:func:`unloaded_readings`): ``readings`` holds the
    conversations replayed before it (``{conversation_id: {reading: s}}``), ``total`` how many were due."""

    def __init__(self, message: str, readings: dict, total: int):
        super().__init__(message)
        self.readings, self.total = readings, total


def _interrupt_hook(phase: str) -> Optional[tuple[int, int]]:
    """Test-only fault injection: ``HARNESS_TEST_INTERRUPT=<phase>:<k>[:<signal>]`` makes the process send
    itself ``signal`` (default ``INT``; ``TERM`` ...) just before the ``k``-th (0-based) conversation of
    ``phase`` (``baseline``: the unloaded-TTFET replays; the run's other phases, ``harness.run.runner``:
    ``startup`` and ``results`` and ``writing`` with ``k`` 0, ``run`` as its ``k``-th conversation finishes),
    once per process (the variable is then removed), so a
    test interrupts (or, with ``STOP``, freezes) a run at a known point instead of racing a timer. ``(k, signal number)`` or None when unset or for another phase."""
    import signal as _signal
    spec = os.environ.get("HARNESS_TEST_INTERRUPT", "")
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] != phase:
        return None
    sig = getattr(_signal, "SIG" + (parts[2] if len(parts) > 2 else "INT").upper().removeprefix("SIG"))
    return int(parts[1]), int(sig)


def unloaded_ttfet(inp: SessionInput, conversations: Sequence[tuple[float, ConversationRecord]],
                   stats: WorkloadStats, *, cache_dir: Optional[Path | str] = None) -> dict[str, float]:
    """Each conversation's unloaded TTFET under the headline reading (``slo.ttfet_definition``), s
    (:func:`unloaded_readings`)."""
    d = inp.ttfet_definition
    return {cid: v[d] for cid, v in unloaded_readings(inp, conversations, stats, cache_dir=cache_dir).items()}


# In-process memo of unloaded first-token times, s: ``(setup key, a conversation's turns) -> ((reading, s), ...)``. An unloaded replay
# depends only on the conversation's turns and the setup below, so a sweep over rates, variants or seeds
# in one process (Hydra's basic launcher, or one joblib worker) replays each distinct conversation once.
_UNLOADED_CACHE: dict[tuple, float] = {}
_UNLOADED_CACHE_MAX = 200_000


def cache_root() -> Optional[Path]:
    """The on-disk cache directory: ``$HARNESS_CACHE_DIR`` if set (``""`` or ``off``: no disk cache),
    else ``results/cache`` of the project (``harness.core.paths.results_root``)."""
    env = os.environ.get("HARNESS_CACHE_DIR")
    if env is not None:
        return None if env.strip() in ("", "off") else Path(env)
    from harness.core.paths import results_root
    return results_root() / "cache"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


SHARD_SCHEMA = "harness.unloaded_ttfet/4"   # /3: the checksum is keyed on the setup digest (its writer); /4: + serving
_READINGS = ("first", "last", "serving", "visible")


def _shard_checksum(values: dict, setup: str) -> str:
    """SHA-256, hex, of the setup digest ``setup`` (the shard's directory name: what the writer's replays
    depended on, config and code, :class:`_DiskCache`) and the shard's values in canonical JSON (sorted keys).

    What it catches: a torn or corrupted file, and a shard written for another setup or code version
    (copied or moved into this directory, or its ``setup`` field edited), whose values would be wrong here.
    What it does not: a deliberate forgery -- the key is not secret, so anyone who can write the cache
    directory can write values with a matching checksum. The cache directory is trusted as the code is
    (docs/outputs.md, "Secrets, partial runs and the cache")."""
    return hashlib.sha256((setup + "\n" + json.dumps(values, sort_keys=True, allow_nan=False)).encode()).hexdigest()


def shard_problem(obj: Any, setup: Optional[str] = None) -> str:
    """Why ``obj`` (a parsed shard file) is not a valid unloaded-TTFET shard of setup ``setup`` (the
    directory's digest; ``None``: the one the shard names), or ``""``. A shard is ``{"schema": SHARD_SCHEMA,
    "setup": <setup digest>, "checksum": <_shard_checksum(values, setup)>, "values": {<32-hex conversation
    digest>: {"first": s, "last": s, "serving": s, "visible": s}}}``, each reading a finite number >= 0 (s) or null."""
    if not isinstance(obj, dict) or set(obj) != {"schema", "setup", "checksum", "values"}:
        return "not a {schema, setup, checksum, values} object"
    if obj["schema"] != SHARD_SCHEMA:
        return f"schema {obj['schema']!r}, expected {SHARD_SCHEMA!r}"
    if setup is not None and obj["setup"] != setup:
        return (f"written for setup {str(obj['setup'])[:40]!r}, not this directory's {setup!r} (another config "
                f"or code version)")
    vals = obj["values"]
    if not isinstance(vals, dict):
        return "values is not an object"
    for k, v in vals.items():
        if not (isinstance(k, str) and len(k) == 32 and all(c in "0123456789abcdef" for c in k)):
            return f"key {k!r:.40} is not a conversation digest"
        if not isinstance(v, dict) or set(v) != set(_READINGS):
            return f"entry {k}: expected readings {list(_READINGS)}, got {v!r:.80}"
        for d, x in v.items():
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))
                                  or not math.isfinite(x) or x < 0):
                return f"entry {k}: reading {d} = {x!r:.40} is not a time in s (a finite number >= 0, or null)"
    try:
        ok = obj["checksum"] == _shard_checksum(vals, str(obj["setup"]))
    except (TypeError, ValueError):
        ok = False
    return "" if ok else "checksum does not match its setup and values"


class _DiskCache:
    """The unloaded first-token shards of one setup (see :func:`unloaded_readings`). Every shard is checked
    (:func:`shard_problem`: schema, setup, shapes, ranges and a SHA-256 checksum keyed on the setup) before any
    of it is used; a shard
    that fails (unreadable, another shape, a bad checksum) is ignored with a warning naming the file and why,
    and its conversations are replayed again. (A crashed writer leaves only a temporary file.)"""

    def __init__(self, cache_dir: Optional[Path | str], setup_key: str):
        root = cache_root() if cache_dir is None else (Path(cache_dir) if str(cache_dir) not in ("", "off") else None)
        self.dir = None if root is None else root / "unloaded_ttfet" / _digest(setup_key + "|" + code_digest())
        self._values: dict[str, dict] = {}
        self.rejected: list[tuple[Path, str]] = []
        if self.dir is not None and self.dir.is_dir():
            for p in sorted(self.dir.glob("*.json")):
                try:
                    obj = json.loads(p.read_text())
                    why = shard_problem(obj, self.dir.name)
                except (OSError, ValueError, UnicodeDecodeError) as e:
                    why = f"unreadable ({type(e).__name__}: {e})"
                if why:
                    self.rejected.append((p, why))
                    log.warning("unloaded-TTFET cache: ignoring shard %s (%s); its conversations are replayed", p, why)
                    continue
                self._values.update(obj["values"])

    def get(self, turns: tuple) -> Optional[tuple]:
        """The cached ``((reading, s), ...)`` of a conversation with these turns (NaN where none), or None."""
        v = self._values.get(_digest(repr(turns)))
        if not isinstance(v, dict):
            return None
        return tuple((d, math.nan if x is None else float(x)) for d, x in v.items())

    def add(self, values: dict) -> None:
        """Write ``values`` as a new shard (atomic rename); a read-only or full disk only loses the cache."""
        if self.dir is None or not values:
            return
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            name = f"{os.getpid()}-{time.time_ns()}"
            tmp = self.dir / f".{name}.tmp"
            setup = self.dir.name
            tmp.write_text(json.dumps({"schema": SHARD_SCHEMA, "setup": setup,
                                       "checksum": _shard_checksum(values, setup), "values": values}, sort_keys=True))
            os.replace(tmp, self.dir / f"{name}.json")
        except OSError as e:
            log.warning("unloaded-TTFET cache not written to %s: %s", self.dir, e)


SETUP_LOCK = ".lock"


def _open_setup_lock(setup_dir: Path) -> Optional[int]:
    try:
        setup_dir.mkdir(parents=True, exist_ok=True)
        return os.open(setup_dir / SETUP_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        log.warning("unloaded-TTFET cache: no lock in %s (%s); replaying unlocked", setup_dir, e)
        return None


def _write_claims(fd: int, digests: Sequence[str]) -> None:
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, "\n".join(digests).encode(), 0)
    except OSError:
        pass   # the claims only order the work of the processes waiting on this one, never their results


def claim_setup(setup_dir: Path, digests: Sequence[str]) -> tuple[Optional[int], Optional[set[str]]]:
    """Try, without waiting, to take the exclusive lock of one setup's shard directory (``<setup_dir>/.lock``,
    an ``fcntl.flock``) and claim the conversations ``digests`` (each ``_digest(repr(turns))``) that this
    process is about to replay, written into the lock file for the others to read.

    Returns ``(descriptor, None)`` when taken (closing the descriptor releases it); ``(None, claimed)`` when
    another process holds it, ``claimed`` being the digests that process named; ``(None, None)`` where the
    directory cannot be made or the filesystem has no ``flock`` (the cache then works unlocked, as before:
    two processes may replay the same conversations, never read a half-written shard).

    :func:`unloaded_readings` holds the lock from its last read of the shards to writing its own, so jobs of a
    sweep that start together on one setup (``hydra/launcher=joblib`` with ``n_jobs`` > 1, Slurm array tasks
    on a shared ``$HARNESS_CACHE_DIR``) do not all replay every conversation: a job that finds the lock held
    replays the conversations the holder did not claim, then waits for it (:func:`setup_lock`), reads its
    shard and replays only what is still missing. The operating system releases the lock when its holder
    dies, however it dies."""
    import fcntl
    fd = _open_setup_lock(setup_dir)
    if fd is None:
        return None, None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            claimed = set(os.pread(fd, 1 << 26, 0).decode("ascii", "replace").split())
        except OSError:
            claimed = set()
        os.close(fd)
        return None, claimed
    except OSError as e:   # e.g. ENOLCK / EOPNOTSUPP on a filesystem without flock
        os.close(fd)
        log.warning("unloaded-TTFET cache: no flock in %s (%s); replaying unlocked", setup_dir, e)
        return None, None
    except BaseException:
        os.close(fd)
        raise
    _write_claims(fd, digests)
    return fd, None


SETUP_LOCK_STALL_S = 60.0
"""How long :func:`setup_lock` waits for a holder that shows no progress (it touches the lock file after every
replay, :func:`_progress`) before replaying unlocked: a holder stopped (SIGSTOP, a suspended Slurm job) or hung
never blocks the other jobs for longer, s."""


def _progress(fd: Optional[int], setup_dir: Path) -> None:
    """Tell the processes waiting on this setup that its holder is alive: touch the lock file (its mtime)."""
    if fd is not None:
        try:
            os.utime(setup_dir / SETUP_LOCK)
        except OSError:
            pass


def setup_lock(setup_dir: Path, digests: Sequence[str] = ()) -> Optional[int]:
    """:func:`claim_setup`, waiting while another process holds the lock and makes progress; returns the
    descriptor, or None where there is no lock to take (as :func:`claim_setup`) or the holder showed no
    progress for :data:`SETUP_LOCK_STALL_S` (then replay unlocked; a warning names the directory). Polls every
    0.1 s (each poll is a :func:`claim_setup`); a Ctrl-C while waiting interrupts the wait."""
    lock = setup_dir / SETUP_LOCK
    last, since = None, time.monotonic()
    while True:
        fd, claimed = claim_setup(setup_dir, digests)
        if fd is not None or claimed is None:     # taken, or no lock to take
            return fd
        try:
            mtime = os.stat(lock).st_mtime_ns     # the holder touches it after every replay (_progress)
        except OSError:
            mtime = None
        now = time.monotonic()
        if mtime != last:
            last, since = mtime, now
        elif now - since > SETUP_LOCK_STALL_S:
            log.warning("unloaded-TTFET cache: the process holding %s shows no progress for %.0f s; "
                        "replaying unlocked", lock, SETUP_LOCK_STALL_S)
            return None
        time.sleep(0.1)


def _unloaded_cache_key(inp: SessionInput, stats: WorkloadStats, name: str, ref: Any) -> str:
    """What an unloaded replay depends on besides the conversation: instances (hardware), model, engine,
    link, the shared system prompt, the reference scheduler and its config (and the workload stats and
    seed when the reference scheduler may read them: one registered with ``reads_workload=True``, or AMPD
    with ``misroute_frac > 0``, whose draw reads ``workload.seed``; its own config, predictor and misroute
    seeds included, is part of the key anyway)."""
    parts = [list(inp.instances), inp.model, inp.engine, inp.link, inp.shared_prefix_tokens, name, ref]
    from harness.core.schedulers import get_spec
    misroutes = getattr(ref, "misroute_frac", 0) > 0
    if get_spec(name).reads_workload or misroutes:
        # (AMPD's misroute draw reads the workload's seed, so a misrouting reference is not seed-free)
        parts += [inp.seed, stats.rate_per_s, stats.mean_turns,
                  *(a.tobytes() for a in (stats.turn_prompt_tokens, stats.turn_new_tokens,
                                          stats.turn_output_tokens, stats.tool_time_s))]
        if misroutes:
            parts.append(("workload_seed", inp.workload_seed))
    return repr(parts)
