"""Agents at SLO: the largest closed population N (concurrent agent sessions) at which the conversation SLO
holds, per variant, by the harness's capacity bisection (``harness.analysis.capacity.bisect_capacity``) on N; and
the compact runs table the results pages read (:func:`collect`).

    python -m harness.analysis.agents_at_slo bisect --variants conserve,ampd_rd --seeds 0,1 --lo 4 --hi 16 \\
        --reading first --target 0.9 --sessions 16 --out /tmp/agents [--reuse <sweep dir> ...] [-- <overrides>]
    python -m harness.analysis.agents_at_slo collect --out docs/data/claude_code_claims/runs.csv <sweep dir> ...

The criterion: the SLO **holds** at N when the mean over the seeds of ``slo_attainment_<reading>`` (the share
of sessions whose TTFET of that reading meets the run's ``slo``) is at least ``target`` (:func:`slo_holds`).
The bisection runs on integers: ``bisect_capacity`` is asked at real points and each is read at ``floor(x)``
sessions, stopping when the bracket is at most 1 session wide, so the answer is exact to one session
(:func:`bisect_agents`). Like the capacity of an arrival rate, it depends on the run length (sessions per
run, ``workload.num_conversations``) and the seeds, which a report states. Each probe is one
``python run.py -m +experiment=<preset> +experiment/variant=<v> workload.concurrency=N workload.seed=...``
sweep; a probe already stored in ``--out``'s ``runs.csv`` or found in a ``--reuse`` sweep is not run again.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence

from harness.analysis.capacity import bisect_capacity
from harness.core import cmdline

# the columns of the compact runs table: config keys (as harness.analysis.claims.classify and workload_frame read
# them) and summary.json keys
CONFIG_KEYS = ("scheduler.name", "scheduler.mode", "cluster.name", "model.name", "workload.name",
               "workload.arrival", "workload.concurrency", "workload.rate_per_s", "workload.num_conversations",
               "workload.seed", "workload.timing", "workload.max_idle_gap_s", "slo.ttfet_s", "slo.ttfet_first_s")
SUMMARY_KEYS = ("num_conversations", "num_turns", "ttfet_first_p95_s", "ttfet_visible_p95_s",
                "slo_attainment_first", "slo_attainment_visible", "tokens_per_joule", "energy_j",
                "ttfet_message_first_p90_s", "ttfet_message_visible_p90_s", "ttfet_session_visible_mean_s",
                "ttft_p95_s", "preemptions", "prefix_hit_frac", "decoder_kv_peak_frac", "valid", "partial")
READINGS = ("first", "visible")


def slo_holds(attainments: Iterable[float], target: float) -> bool:
    """Whether the SLO holds at one N: the mean over seeds of the SLO attainment (fraction of sessions,
    0-1; one value per seed) is at least ``target`` (0-1).

    Raises:
        ValueError: no attainment, one outside [0, 1] or not finite, or ``target`` outside (0, 1]."""
    a = [float(x) for x in attainments]
    if not a or not all(math.isfinite(x) and 0 <= x <= 1 for x in a):
        raise ValueError(f"slo_holds: need >= 1 attainment in [0, 1], got {a}")
    if not 0 < target <= 1:
        raise ValueError(f"slo_holds: target must be in (0, 1], got {target}")
    return sum(a) / len(a) >= target


def bisect_agents(holds_at: Callable[[int], bool], lo: int, hi: int
                  ) -> tuple[Optional[int], Optional[int], dict[int, bool]]:
    """The largest N in ``[lo, hi]`` (sessions, integers, ``1 <= lo < hi``) at which ``holds_at(N)``, by
    :func:`harness.analysis.capacity.bisect_capacity` with each point read at ``floor(x)`` and a tolerance of 1
    session (each N asked once). Returns ``(largest N that holds, smallest N above it that fails, {N: holds})``:
    ``(None, lo, ...)`` when ``lo`` already fails, ``(hi, None, ...)`` when ``hi`` holds. Assumes the SLO, once
    broken, stays broken at larger N (the tried dict shows where a noisy criterion breaks that).

    Raises:
        ValueError: ``lo``/``hi`` not integers with ``1 <= lo < hi``."""
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo < hi):
        raise ValueError(f"bisect_agents: need integers 1 <= lo < hi, got lo={lo!r}, hi={hi!r}")
    tried: dict[int, bool] = {}

    def ask(x: float) -> bool:
        n = int(math.floor(x))
        if n not in tried:
            tried[n] = bool(holds_at(n))
        return tried[n]

    low, high, _ = bisect_capacity(ask, float(lo), float(hi), 1.0)
    if not math.isfinite(low):
        return None, lo, tried
    if not math.isfinite(high):
        return hi, None, tried
    return int(math.floor(low)), int(math.floor(high)), tried


def run_row(run_dir: Path) -> dict:
    """One run's row of the compact table: :data:`CONFIG_KEYS` from its ``config.yaml`` and :data:`SUMMARY_KEYS`
    from its ``summary.json`` (missing ones empty)."""
    from harness.analysis.report import load_config
    cfg = load_config(run_dir)
    summ = json.loads((run_dir / "summary.json").read_text())
    row = {k: cfg.get(k) for k in CONFIG_KEYS}
    row.update({k: summ.get(k) for k in SUMMARY_KEYS})
    row["code"] = (json.loads((run_dir / "meta.json").read_text()).get("fingerprint", {}).get("components", {})
                   .get("code", "")[:12] if (run_dir / "meta.json").is_file() else "")
    return row


def collect(sweep_dirs: Sequence[Path]) -> list[dict]:
    """The rows (:func:`run_row`) of every run (a directory with ``summary.json``) under ``sweep_dirs``, sorted
    by directory."""
    rows = []
    for d in sweep_dirs:
        for s in sorted(Path(d).rglob("summary.json")):
            rows.append(run_row(s.parent))
    return rows


def write_rows(path: Path, rows: list[dict]) -> None:
    """Write ``rows`` as CSV (columns :data:`CONFIG_KEYS`, :data:`SUMMARY_KEYS`, ``code``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*CONFIG_KEYS, *SUMMARY_KEYS, "code"])
        w.writeheader()
        w.writerows(rows)


def variant_of(row: dict) -> str:
    """``conserve``, ``ampd_rd`` / ``ampd_cost`` (AMPD's mode), or the scheduler's name (as
    ``harness.analysis.claims.classify``)."""
    name = str(row.get("scheduler.name"))
    if name == "ampd":
        return "ampd_cost" if str(row.get("scheduler.mode")) == "cost" else "ampd_rd"
    return name


def _timing(row: dict) -> tuple[str, Optional[float]]:
    g = row.get("workload.max_idle_gap_s")
    try:
        g = float(g) if g not in (None, "") else None
    except ValueError:
        g = None
    return str(row.get("workload.timing") or "think"), (g if g is not None and math.isfinite(g) else None)


def attainments_at(rows: Sequence[dict], variant: str, reading: str, n: int, seeds: Sequence[int],
                   timing: tuple[str, Optional[float]] = ("think", None), sessions: Optional[int] = None
                   ) -> dict[int, float]:
    """``{seed: slo_attainment_<reading>}`` of the stored closed-population runs (:func:`collect`) of ``variant`` at
    N = ``n`` with ``timing`` (``(workload.timing, workload.max_idle_gap_s)``) and, unless None, ``sessions``
    sampled per run (``workload.num_conversations``), for the seeds of ``seeds`` found."""
    got = {}
    for r in rows:
        if (variant_of(r) == variant and _timing(r) == timing and str(r.get("workload.arrival")) == "closed"
                and (sessions is None or _int(r.get("workload.num_conversations")) == sessions)
                and _int(r.get("workload.concurrency")) == n and _int(r.get("workload.seed")) in seeds):
            got[int(float(r["workload.seed"]))] = float(r[f"slo_attainment_{reading}"])
    return got


def _int(v) -> Optional[int]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return int(x) if math.isfinite(x) else None


def agents_from_rows(rows: Sequence[dict], variant: str, reading: str, target: float, lo: int, hi: int,
                     seeds: Sequence[int], timing: tuple[str, Optional[float]] = ("think", None),
                     sessions: Optional[int] = None) -> tuple[Optional[int], Optional[int], dict[int, bool]]:
    """:func:`bisect_agents` replayed on stored rows (:func:`collect`) of one variant, timing and run length
    (``sessions``): N holds when :func:`slo_holds` on :func:`attainments_at`.

    Raises:
        KeyError: a probe the bisection asks for lacks a seed's run (naming variant, N and the seeds found)."""
    def holds(n: int) -> bool:
        got = attainments_at(rows, variant, reading, n, seeds, timing, sessions)
        if set(got) != set(seeds):
            raise KeyError(f"{variant} at N={n}: runs for seeds {sorted(got)}, need {sorted(seeds)}")
        return slo_holds(got.values(), target)
    return bisect_agents(holds, lo, hi)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = cmdline.ArgumentParser(prog="python -m harness.analysis.agents_at_slo", description=__doc__.split("\n\n")[0],
                                epilog="Exit status: 0 done; 2 bad input (one line naming the flag); 130 interrupted.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bisect", help="run the probes of the bisection per variant and print agents at SLO")
    b.add_argument("--variants", default="conserve,ampd_rd,ampd_cost",
                   help="conf/experiment/variant options, comma-separated")
    b.add_argument("--seeds", type=cmdline.number_list(0, integer=True), default="0,1", help="workload seeds")
    b.add_argument("--lo", type=cmdline.number(1, integer=True), default=2, help="smallest N (sessions, >= 1)")
    b.add_argument("--hi", type=cmdline.number(2, integer=True), default=16, help="largest N (sessions, > lo)")
    b.add_argument("--reading", choices=READINGS, default="first", help="the TTFET reading whose SLO must hold")
    b.add_argument("--target", type=cmdline.number(0, 1, lo_open=True), default=0.9,
                   help="the SLO attainment (mean over seeds, 0-1] that counts as holding")
    b.add_argument("--preset", default="claude_code_claims", help="the +experiment preset of every probe")
    b.add_argument("--sessions", type=cmdline.number(1, integer=True), default=16,
                   help="sessions sampled per run (workload.num_conversations; the run length, >= 1)")
    b.add_argument("--reuse", nargs="*", default=[], type=Path, help="sweep directories whose runs count as probes")
    b.add_argument("--out", type=cmdline.writable(directory=True), required=True,
                   help="directory for the probes' sweeps and runs.csv")
    c = sub.add_parser("collect", help="write the compact runs table of sweep directories")
    c.add_argument("--out", type=Path, required=True, help="the CSV to write")
    c.add_argument("dirs", nargs="+", type=Path, help="sweep (or run) directories")
    a = ap.parse_args(argv)
    if a.cmd == "collect":
        missing = [d for d in a.dirs if not d.is_dir()]
        if missing:
            ap.error(f"dirs: not a directory: {missing[0]}")
        rows = collect(a.dirs)
        write_rows(a.out, rows)
        print(f"{len(rows)} runs -> {a.out}")
        return cmdline.OK
    if a.lo >= a.hi:
        ap.error(f"--lo ({a.lo}) must be < --hi ({a.hi})")
    from harness.core.paths import PROJECT_ROOT
    variants = [v for v in a.variants.split(",") if v]
    known = {p.stem for p in (PROJECT_ROOT / "conf" / "experiment" / "variant").glob("*.yaml")}
    bad = [v for v in variants if v not in known]
    if bad:
        ap.error(f"--variants: unknown variant {bad[0]!r}; one of {sorted(known)}")
    seeds = [int(s) for s in a.seeds]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = collect([out, *a.reuse])
    timing = ("think", None)
    for kv in extra:
        if kv.startswith("workload.timing="):
            timing = (kv.split("=", 1)[1], timing[1])
        if kv.startswith("workload.max_idle_gap_s="):
            v = kv.split("=", 1)[1]
            timing = (timing[0], None if v == "null" else float(v))
    print(f"agents at SLO: {a.preset}, SLO attainment ({a.reading} reading) >= {a.target:g} as the mean over seeds "
          f"{seeds}, N in [{a.lo}, {a.hi}], tolerance 1 session, {a.sessions} sessions per run; "
          f"{' '.join(extra) or 'no extra overrides'}")
    print("| variant | agents at SLO (largest N that holds) | smallest N above that fails | probes (N: mean attainment) |")
    print("|---|---|---|---|")
    for v in variants:
        def holds(n: int) -> bool:
            got = attainments_at(rows, v, a.reading, n, seeds, timing, a.sessions)
            if set(got) != set(seeds):
                d = out / f"{v}_N{n}"
                cmd = [sys.executable, str(PROJECT_ROOT / "run.py"), "-m", f"+experiment={a.preset}",
                       f"+experiment/variant={v}", f"workload.concurrency={n}",
                       "workload.seed=" + ",".join(map(str, seeds)), f"workload.num_conversations={a.sessions}",
                       f"hydra.sweep.dir={d}", *extra]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                rows.extend(collect([d]))
                write_rows(out / "runs.csv", collect([out]))
                got = attainments_at(rows, v, a.reading, n, seeds, timing, a.sessions)
            return slo_holds(got.values(), a.target)
        n_ok, n_bad, tried = bisect_agents(holds, a.lo, a.hi)
        means = [f"{n}: {sum(x.values()) / len(x):.3f}" for n in sorted(tried)
                 for x in [attainments_at(rows, v, a.reading, n, seeds, timing, a.sessions)]]
        print(f"| {v} | {n_ok if n_ok is not None else f'< {a.lo}'} | {n_bad if n_bad is not None else f'> {a.hi}'} "
              f"| {', '.join(means)} |", flush=True)
    return cmdline.OK


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
