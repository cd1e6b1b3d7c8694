"""The WAIT table of docs/wait.md and docs/papers.md: Figure B's setting under both step models.

    nice -n 10 python scripts/wait_table.py --rates 23,22,24,20,12 --seeds 0-9 --n 3000 --jobs 2 \\
        --no-capacity --out /work/sweeps/waittable
    nice -n 10 python scripts/wait_table.py --no-table --models roofline,vidur_profile,vidur_profile_per_request \\
        --n 3000 --cap-seeds 0-4 --cap-range 19,25 --cap-tol 0.375 --jobs 2 --out /work/sweeps/waitcap

Figure B's setting (``wait_single``: 512 prompt / 20 output tokens, Poisson arrivals; Meta-Llama-3-8B on
one A100, ``+experiment=wait_paper``), four arms on the same requests per seed: Sarathi-like
(``wait_sarathi_llama3``, budget 512), WAIT-CP (``wait_cp_llama3``, the authors' scheduler, ``batch_est``
508, ``tl`` 21, ``cs`` 256), the same-budget control (``wait_cp_control_llama3``: Sarathi-like with
budget 508 and at most 21 requests holding KV) and the chunk-cap control (the same with
``engine.max_prefill_chunk_tokens=256``), each under ``engine.step_model=roofline`` and
``engine.step_model=vidur_profile``. Latency: mean E2E over the central window (prompts 25-75 % by
arrival, ``e2e_central_mean_s``).

Prints (markdown), per step model and rate: each arm's geometric-mean E2E over the seeds; the paired
ratio of each other arm to Sarathi-like (``harness.analysis.stats.ratio_interval``: geometric mean of the
per-seed ratios - 1 with the 95 % t-interval of the mean log ratio, n and the sign count); for WAIT-CP the
verdict (``harness.analysis.stats.verdict``) against the paper's claim: "over 70 %" lower latency than
Sarathi at lambda = 23 (``paper_effect`` -70, ``min_effect`` its default, half), elsewhere the direction
only (``min_effect`` 0); the controls are not in the paper ("—"); and the chunk cap alone (chunk-cap control /
same-budget control, its verdict against "the cap lowers E2E", direction only). ``--models`` picks the step
models (default ``roofline,vidur_profile``; ``vidur_profile_per_request`` is ``vidur_profile`` with the KV write
of the FlashInfer generation Vidur profiled, one thread block per request: ``harness.sim.perf``).
Then the verdict per rate across the
step models (the one word, or "depends on step model"), and the capacity with its uncertainty
(``--no-table`` runs only this part): per step model, arm (``--cap-arms``) and seed of ``--cap-seeds``, the highest
rate whose central window stays bounded (that seed's window growth ratio <= 1.25,
``harness.analysis.capacity.seed_capacities``), one bisection per seed on ``--cap-range`` to ``--cap-tol``; each
seed's capacity is its bracket's midpoint, printed per arm as mean [95 % t-interval] (min-max, n) over the seeds,
and the capacity margin WAIT-CP / Sarathi-like - 1 paired on the seed (``harness.analysis.capacity
.capacity_margin``) with its verdict against the paper's +4.5 % (WAIT ~23 vs Sarathi ~22 prompts/s). This is the
one capacity estimator of the WAIT table (docs/wait.md, "Capacity with its uncertainty"); until 2026-12-06 the
table bisected once on the seeds' geometric-mean growth ratio, a bracket with no uncertainty.

Every run's result is appended to ``<out>/runs.csv`` as it finishes (nothing measured is lost on an
interrupt; a rerun with the same ``--out`` reuses the rows already there that carry this code's fingerprint;
one writer per ``--out``, a second exits 2; a torn last line is dropped: :class:`Store`).
"""

from __future__ import annotations

import csv
import io
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vidur_wait_step_models import e2e_series  # noqa: E402

from harness.core import cmdline  # noqa: E402
from harness.analysis.capacity import (GROWTH_BOUND, capacity_margin, capacity_summary, capacity_text,  # noqa: E402
                                       growth_ratio, seed_capacities)
from harness.analysis.stats import ratio_interval, verdict  # noqa: E402

ARMS = {
    "sarathi": "wait_sarathi_llama3",
    "wait_cp": "wait_cp_llama3",
    "budget_control": "wait_cp_control_llama3",
    "chunk_cap_control": "wait_cp_control_llama3@engine.max_prefill_chunk_tokens=256",
}
LABEL = {"sarathi": "Sarathi-like", "wait_cp": "WAIT-CP", "budget_control": "same-budget control",
         "chunk_cap_control": "chunk-cap control"}
MODELS = ("roofline", "vidur_profile")          # --models' default
STEP_MODELS = ("roofline", "vidur_profile", "vidur_profile_per_request")   # --models' choices (harness.sim.perf)
PAPER_EFFECT_PCT = -70.0          # the WAIT paper's text: "over 70 %" lower latency than Sarathi at lambda = 23
PAPER_RATE = 23.0
# the paper's stability limits on 512/20 (numerical.tex, "Single-type workload": WAIT ~23, Sarathi ~22 prompts/s;
# docs/wait.md): WAIT's capacity margin over Sarathi, % (W1)
PAPER_CAP_PCT = (23.0 / 22.0 - 1) * 100
FIELDS = ["model", "arm", "rate", "seed", "n", "e2e_central_mean_s", "growth_ratio", "wall_s", "fingerprint"]


def _one(task):
    model, arm, rate, seed, n = task
    t0 = time.perf_counter()
    e2e = e2e_series(ARMS[arm], rate, n, seed, model)
    k = len(e2e)
    return {"model": model, "arm": arm, "rate": rate, "seed": seed, "n": n,
            "e2e_central_mean_s": float(e2e[k // 4: 3 * k // 4].mean()), "growth_ratio": growth_ratio(e2e),
            "wall_s": round(time.perf_counter() - t0, 2)}


ROOT = Path(__file__).resolve().parents[1]
LOCK_NAME = ".wait_table.lock"   # the writer's lock in --out (harness.analysis.provenance.DirLock)
FINGERPRINTS = "fingerprints.json"  # <out>/fingerprints.json: {digest: its components}, to name what changed
_FP: list[dict] = []


def fingerprint() -> dict:
    """What a row of ``runs.csv`` depends on, ``{"digest": 16 hex, "components": {...}}``, computed once per
    process: ``code`` (every ``.py`` under ``harness/`` and ``baselines/``, ``harness.core.paths.code_digest``,
    as run.py's fingerprint), ``scripts`` (the scripts that compute a row: this one,
    ``vidur_wait_step_models.py``, ``wait_check.py``), ``config`` (every ``conf/**/*.yaml``: the presets and
    profiles the arms compose) and ``data`` (the Vidur profile tables, ``docs/data/``, that
    ``engine.step_model=vidur_profile`` reads: ``harness.sim.perf.VIDUR_PROFILES``). Each a SHA-256, first
    32 hex digits (``harness.analysis.provenance``); ``digest`` the first 16 of the SHA-256 over them."""
    if not _FP:
        import json

        from harness.analysis.provenance import file_digest, sha256_text
        from harness.core.paths import code_digest, data_path
        from harness.sim.perf import VIDUR_PROFILES

        def files(paths) -> str:
            return sha256_text("".join(f"{p.relative_to(ROOT)}\0{file_digest(p)}\n" for p in sorted(paths)))
        here = Path(__file__).resolve().parent
        tables = {data_path(f"docs/data/{f}") for shapes in VIDUR_PROFILES.values() for v in shapes.values()
                  for f in v[:2]}
        comp = {"code": code_digest(),
                "scripts": files([here / n for n in ("wait_table.py", "vidur_wait_step_models.py", "wait_check.py")]),
                "config": files(ROOT.joinpath("conf").rglob("*.yaml")),
                "data": files(p for p in tables if p.is_file())}
        _FP.append({"digest": sha256_text(json.dumps(comp, sort_keys=True))[:16], "components": comp})
    return _FP[0]


def read_runs(path: Path) -> tuple[list[tuple[int, dict]], int]:
    """The rows of ``runs.csv`` at ``path`` as ``[(line number, row)]`` (``rate``, ``seed``, ``n`` and the two
    measures parsed; ``fingerprint`` ``""`` for a row written before fingerprints), and the number of bytes of
    a *torn tail* dropped: a last line without its newline, what a writer killed mid-row leaves (its run is
    simply not done). A missing file: ``([], 0)``.

    Raises:
        ValueError: a complete line that is not a row (``<path>:<line>: ...``): something else wrote there.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    keep = data.rfind(b"\n") + 1
    out = []
    reader = csv.DictReader(io.StringIO(data[:keep].decode(errors="replace"), newline=""))
    for r in reader:
        try:
            if None in r or None in r.values():
                raise ValueError(f"{len(FIELDS)} fields expected")
            r = {**r, "rate": float(r["rate"]), "seed": int(r["seed"]), "n": int(r["n"]),
                 "e2e_central_mean_s": float(r["e2e_central_mean_s"]), "growth_ratio": float(r["growth_ratio"]),
                 "fingerprint": r.get("fingerprint") or ""}
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{reader.line_num}: not a row of runs.csv ({e}); move the file aside") from None
        out.append((reader.line_num, r))
    return out, len(data) - keep


class Store:
    """The runs done so far, keyed ``(model, arm, rate, seed, n)``, mirrored to ``runs.csv`` (``FIELDS``; one
    row appended and flushed as each run finishes), with run.py's guarantees (``harness.analysis.provenance``):

    * a lock: a writing store holds ``<out>/.wait_table.lock`` (``DirLock``, an ``flock`` the system drops
      when its holder dies), so a second run into the same ``--out`` is refused (``LockHeld``), never runs the
      same jobs beside the first;
    * a fingerprint per row (:func:`fingerprint`): a row of another code, script, config or profile data is
      not reused; the job runs again and its new row is appended (the last row of a key and fingerprint wins);
    * a torn tail (:func:`read_runs`) is dropped, and cut off the file before the next row is appended.

    ``readonly=True`` (``--report-only``): no lock, nothing written; every row counts, those of this
    fingerprint first, and :attr:`foreign` says how many of the others are used. A ``runs.csv`` written
    before fingerprints (no ``fingerprint`` column) is rewritten with the column (empty) by a writing store.

    Raises:
        LockHeld: another live process writes to this ``runs.csv``.
        ValueError: a line of ``runs.csv`` that is not a row (:func:`read_runs`).
    """

    def __init__(self, path: Path, readonly: bool = False):
        from harness.analysis.provenance import DirLock
        self.path, self.rows, self.lock, self.readonly = path, {}, threading.Lock(), readonly
        self.fp, self.f, self.w, self.foreign = fingerprint(), None, None, 0
        self.dir_lock = None if readonly else DirLock(path.parent, LOCK_NAME, "choose another --out").acquire()
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        rows, torn = read_runs(self.path)
        if torn:
            print(f"warning: {self.path}: dropped a torn last line ({torn} bytes; a run killed while writing "
                  "it): that run is done again", file=sys.stderr, flush=True)
        mine, other = {}, {}
        for _, r in rows:
            (mine if r["fingerprint"] == self.fp["digest"] else other)[self.key(r)] = r
        self.rows = dict(mine)
        self.foreign = 0
        if self.readonly:
            for k, r in other.items():
                if k not in mine:
                    self.rows[k] = r
                    self.foreign += 1
        stale = {r["fingerprint"] for k, r in other.items() if k not in mine}
        if stale:
            print(f"warning: {self.path}: {sum(k not in mine for k in other)} rows of another fingerprint "
                  f"({self._changed(stale)}) " + ("reported as they are (a run without --report-only recomputes "
                                                   "them)" if self.readonly else "are not reused: those jobs run again"),
                  file=sys.stderr, flush=True)
        self.f = self.w = None
        if self.readonly:
            return
        head = b""
        if self.path.exists():
            with open(self.path, "rb") as f:
                head = f.readline()
        header = next(csv.reader([head.decode(errors="replace")]), []) if head else []
        if header and header != FIELDS:   # written before fingerprints: the column added, the rows kept
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            with open(tmp, "w", newline="") as f:
                w = csv.DictWriter(f, FIELDS, extrasaction="ignore")
                w.writeheader()
                w.writerows(r for _, r in rows)
            os.replace(tmp, self.path)
        elif torn:
            os.truncate(self.path, self.path.stat().st_size - torn)
        self._remember_fingerprint()
        new = not self.path.exists() or self.path.stat().st_size == 0
        self.f = open(self.path, "a", newline="")
        self.w = csv.DictWriter(self.f, FIELDS)
        if new:
            self.w.writeheader()
            self.f.flush()

    def _changed(self, stale: set) -> str:
        """What differs between this fingerprint and the ``stale`` digests, from ``fingerprints.json``."""
        import json
        try:
            known = json.loads((self.path.parent / FINGERPRINTS).read_text())
        except (OSError, ValueError):
            known = {}
        parts = []
        for d in sorted(stale):
            if not d:
                parts.append("none recorded: written before fingerprints")
            elif isinstance(known.get(d), dict):
                now = self.fp["components"]
                changed = [f"{k} ({str(known[d].get(k))[:12]} -> {v[:12]})" for k, v in now.items()
                           if known[d].get(k) != v]
                parts.append(f"{d}: " + ", ".join(changed or ["same components"]))
            else:
                parts.append(f"{d}: components unknown")
        return "; ".join(parts) + f"; now {self.fp['digest']}"

    def _remember_fingerprint(self) -> None:
        import json
        p = self.path.parent / FINGERPRINTS
        try:
            known = json.loads(p.read_text())
        except (OSError, ValueError):
            known = {}
        if known.get(self.fp["digest"]) != self.fp["components"]:
            known[self.fp["digest"]] = self.fp["components"]
            tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            os.replace(tmp, p)

    def close(self) -> None:
        """Close ``runs.csv`` and drop the lock (idempotent)."""
        if self.f is not None:
            self.f.close()
            self.f = None
        if self.dir_lock is not None:
            self.dir_lock.release()
            self.dir_lock = None

    @staticmethod
    def key(r):
        return (r["model"], r["arm"], float(r["rate"]), int(r["seed"]), int(r["n"]))

    def done(self, tasks) -> bool:
        return all((t[0], t[1], float(t[2]), t[3], t[4]) in self.rows for t in tasks)

    def run(self, pool, tasks):
        """The rows of ``tasks`` (``(model, arm, rate, seed, n)`` each), running those not done yet (on ``pool``
        when given) and appending each new row as it finishes.

        Raises:
            RuntimeError: a read-only store (``--report-only``) asked to run something.
        """
        todo = [t for t in dict.fromkeys(tasks) if (t[0], t[1], float(t[2]), t[3], t[4]) not in self.rows]
        if todo and self.readonly:
            raise RuntimeError(f"{len(todo)} runs not in {self.path} (read-only)")
        for r in (pool.imap_unordered(_one, todo) if pool else map(_one, todo)):
            r["fingerprint"] = self.fp["digest"]
            with self.lock:
                self.rows[self.key(r)] = r
                self.w.writerow(r)
                self.f.flush()
        return [self.rows[(t[0], t[1], float(t[2]), t[3], t[4])] for t in tasks]


def _pct(est, ci):
    return f"{est:+.1f} % [{ci[0]:+.1f}, {ci[1]:+.1f}]"


def _span(seeds: list[int]) -> str:
    """``0-9`` for consecutive seeds, else ``0,2,5``."""
    return f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1 \
        else ",".join(map(str, seeds))


def main(argv=None) -> int:
    """The command line (module docstring). Exit status: 0 printed; 2 bad input (a number not finite or out of
    range, named by its flag; an --out that cannot be written); 130 interrupted (Ctrl-C, SIGTERM: the runs
    finished so far stay in runs.csv)."""
    ap = cmdline.ArgumentParser(prog="scripts/wait_table.py", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 printed; 2 bad input (one error line naming the flag); 130 "
                                       "interrupted (the runs finished so far stay in runs.csv; rerun to resume).")
    ap.add_argument("--rates", type=cmdline.number_list(0, lo_open=True), default="23,22,24,20,12",
                    help="prompts/s (> 0), comma-separated; run in this order, printed sorted")
    ap.add_argument("--seeds", type=cmdline.number_list(0, integer=True, ranges=True, min_len=2), default="0-9",
                    help="'a-b' or comma-separated workload seeds (>= 0, at least 2)")
    ap.add_argument("--n", type=cmdline.number(8, integer=True), default=1500, help="prompts per run (>= 8)")
    ap.add_argument("--jobs", type=cmdline.number(1, integer=True), default=2,
                    help="worker processes (>= 1; at most 2 on the shared machine)")
    ap.add_argument("--cap-seeds", type=cmdline.number_list(0, integer=True, ranges=True), default="0-3",
                    help="seeds of the capacity bisection")
    ap.add_argument("--cap-range", type=cmdline.number_list(0, lo_open=True, min_len=2, max_len=2), default="16,28",
                    help="bisection bracket lo,hi (prompts/s, 0 < lo < hi)")
    ap.add_argument("--cap-tol", type=cmdline.number(0, lo_open=True), default=0.75,
                    help="bisection stops at this bracket width (prompts/s, > 0)")
    ap.add_argument("--models", default=",".join(MODELS),
                    help=f"step models, comma-separated, of {', '.join(STEP_MODELS)} (vidur_profile_per_request: the "
                         "KV write of the FlashInfer generation Vidur profiled, harness.sim.perf)")
    ap.add_argument("--cap-arms", default=",".join(ARMS),
                    help=f"arms of the capacity bisections, comma-separated, of {', '.join(ARMS)} (sarathi and "
                         "wait_cp give the margin)")
    ap.add_argument("--no-capacity", action="store_true", help="skip the capacity bisections")
    ap.add_argument("--no-table", action="store_true",
                    help="skip the latency table (--rates, --seeds): the capacity bisections only")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: print the cells (and capacities) that runs.csv holds complete")
    ap.add_argument("--out", type=cmdline.writable(directory=True), required=True, help="directory for runs.csv")
    a = ap.parse_args(argv)
    rates, seeds, cap_seeds = a.rates, a.seeds, a.cap_seeds
    models = [m for m in a.models.split(",") if m]
    if not models or any(m not in STEP_MODELS for m in models):
        ap.error(f"argument --models: comma-separated names of {', '.join(STEP_MODELS)}, got {a.models!r}")
    cap_arms = [x for x in a.cap_arms.split(",") if x]
    if not cap_arms or any(x not in ARMS for x in cap_arms):
        ap.error(f"argument --cap-arms: comma-separated names of {', '.join(ARMS)}, got {a.cap_arms!r}")
    cap_lo, cap_hi = a.cap_range
    if not cap_lo < cap_hi:
        ap.error(f"argument --cap-range: lo < hi needed, got {cap_lo:g},{cap_hi:g}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    from harness.analysis.provenance import LockHeld
    try:
        store = Store(out / "runs.csv", readonly=a.report_only)
    except (LockHeld, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pool = None
    t_start = time.perf_counter()
    try:
        pool = cmdline.quiet_pool(a.jobs) if a.jobs > 1 else None
        if not a.no_table:
            cell = {(m, r): [(m, arm, r, s, a.n) for arm in ARMS for s in seeds] for r in rates for m in models}
            tasks = [t for r in rates for m in models for t in cell[(m, r)]]     # in --rates order, every model
            if not a.report_only:
                store.run(pool, tasks)
            print(f"wait_single (512/20), Meta-Llama-3-8B, 1 x A100, n={a.n} prompts per run, seeds {_span(seeds)}; "
                  "E2E = central-window mean (s), geometric mean over the seeds; ratios paired per seed")
            print()
            print("| step model | prompts/s | Sarathi-like (s) | WAIT-CP (s) | same-budget control (s) "
                  "| chunk-cap control (s) "
                  "| arms (a / b) | a / b − 1 | n (sign count) | verdict |")
            print("|---|---|---|---|---|---|---|---|---|---|")
            words: dict[tuple[str, float], str] = {}
            for m in models:
                for r in sorted(rates):
                    if not store.done(cell[(m, r)]):
                        continue
                    e2e = {arm: np.array([store.rows[(m, arm, r, s, a.n)]["e2e_central_mean_s"] for s in seeds])
                           for arm in ARMS}
                    gm = {arm: float(np.exp(np.log(v).mean())) for arm, v in e2e.items()}
                    head = f"| {m} | {r:g} | {gm['sarathi']:.3f} | {gm['wait_cp']:.3f} | {gm['budget_control']:.3f} " \
                           f"| {gm['chunk_cap_control']:.3f} "
                    for arm in ("wait_cp", "budget_control", "chunk_cap_control"):
                        est, ci, n, k = ratio_interval(np.log(e2e[arm] / e2e["sarathi"]))
                        if arm == "wait_cp":
                            word = verdict(est, ci, PAPER_EFFECT_PCT, min_effect=None if r == PAPER_RATE else 0.0)
                            words[(m, r)] = word
                        else:
                            word = "—"
                        print(f"{head}| {LABEL[arm]} / Sarathi-like | {_pct(est, ci)} | {n} ({k} of {n}) | {word} |")
                        head = "| | | | | | "
                    # the chunk cap alone (WAIT-CP's cs = 256 at the same budget and KV-holder limit): its direction
                    est, ci, n, k = ratio_interval(np.log(e2e["chunk_cap_control"] / e2e["budget_control"]))
                    print(f"{head}| chunk-cap control / same-budget control (the cap alone) | {_pct(est, ci)} | "
                          f"{n} ({k} of {n}) | {verdict(est, ci, -1.0, min_effect=0.0)} |")
            print()
            print("WAIT-CP vs Sarathi-like, verdict per rate across the step models (paper: lower latency than "
                  "Sarathi; "
                  f"at {PAPER_RATE:g}/s 'over 70 %'):")
            print()
            print("| prompts/s | " + " | ".join(models) + " | overall |")
            print("|---|" + "---|" * (len(models) + 1))
            for r in sorted(rates):
                if any((m, r) not in words for m in models):
                    continue
                w = [words[(m, r)] for m in models]
                print(f"| {r:g} | " + " | ".join(w) + f" | {w[0] if len(set(w)) == 1 else 'depends on step model'} |")
            print(f"\n(table: {len(tasks)} runs, {time.perf_counter() - t_start:.0f} s wall)", flush=True)
        if a.no_capacity:
            return 0
        t_cap = time.perf_counter()
        print(f"\nCapacity, per seed: the highest rate whose central window stays bounded (that seed's window growth "
              f"ratio <= {GROWTH_BOUND}), one bisection per seed of {_span(cap_seeds)} on [{cap_lo:g}, {cap_hi:g}] "
              f"prompts/s to {a.cap_tol:g}, n={a.n}; each seed's capacity the midpoint of its bracket; mean [95 % "
              "t-interval] (min-max) over the seeds; margins paired on the seed\n")
        # one bisection per (model, arm, seed); the rates of one bisection depend on its earlier answers, so the
        # bisections run side by side (threads feeding the worker pool). Daemon threads, joined here: a Ctrl-C
        # reaches this (main) thread, which terminates the pool; a bisection left waiting does not hold the exit
        brackets: dict = {}

        def search(m, arm, seed):
            def bounded_at(rate, s):
                probe = [(m, arm, rate, s, a.n)]
                if a.report_only and not store.done(probe):
                    raise LookupError(f"{m} {arm} {rate:g} seed {s}: not in runs.csv")
                return store.run(pool, probe)[0]["growth_ratio"] <= GROWTH_BOUND
            return seed_capacities(bounded_at, [seed], cap_lo, cap_hi, a.cap_tol)[seed]
        jobs = [(m, arm, s) for m in models for arm in cap_arms for s in cap_seeds]
        found: dict = {}
        gate = threading.Semaphore(max(1, a.jobs))     # at most --jobs runs at once

        def bisect_one(key):
            try:
                with gate:
                    found[key] = search(*key)
            except BaseException as e:   # re-raised below, in the main thread (LookupError: incomplete)
                found[key] = e
        threads = [threading.Thread(target=bisect_one, args=(k,), daemon=True) for k in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k in jobs:
            if isinstance(found[k], BaseException) and not isinstance(found[k], LookupError):
                raise found[k]
        for m in models:
            for arm in cap_arms:
                got = {s: found[(m, arm, s)] for s in cap_seeds if not isinstance(found[(m, arm, s)], BaseException)}
                if len(got) == len(cap_seeds):
                    brackets[(m, arm)] = got
                    print(f"  {m} {LABEL[arm]}: "
                          + ", ".join(f"seed {s} [{lo:g}, {hi:g})" for s, (lo, hi) in got.items()))
                else:
                    print(f"  {m} {LABEL[arm]}: incomplete ({len(got)} of {len(cap_seeds)} seeds in runs.csv)")
        print()
        print("| step model | " + " | ".join(LABEL[arm] for arm in ARMS)
              + " | capacity margin WAIT-CP / Sarathi-like − 1 (paired) | verdict |")
        print("|---|" + "---|" * (len(ARMS) + 2))
        for m in models:
            if any((m, arm) not in brackets for arm in ("sarathi", "wait_cp")):
                continue
            cells = [capacity_text(capacity_summary(brackets[(m, arm)])) if (m, arm) in brackets else "—"
                     for arm in ARMS]
            est, ci, n, k, word = capacity_margin(brackets[(m, "wait_cp")], brackets[(m, "sarathi")], PAPER_CAP_PCT)
            print(f"| {m} | " + " | ".join(cells) + f" | {_pct(est, ci)} (n={n}, {k} of {n}) | {word} |")
        print(f"\n(capacity: {time.perf_counter() - t_cap:.0f} s wall; total {time.perf_counter() - t_start:.0f} s)")
    except KeyboardInterrupt as e:
        if pool:
            pool.terminate()   # the workers stop mid-task; their finished runs are in runs.csv
        print(f"interrupted ({str(e) or 'Ctrl-C'}); the runs finished so far are in {out / 'runs.csv'} (rerun the same "
              f"command to resume)", file=sys.stderr)
        return cmdline.INTERRUPTED
    finally:
        if pool:
            pool.close()
            pool.join()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
