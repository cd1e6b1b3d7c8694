"""Enough seeds, chosen by the data: add seeds (``workload.seed``) to a paired cell, at planned looks, until its
interval is narrow enough, its verdict is decided, or a cap is reached, keeping the false-verdict rate at most 5 %.

    python -m harness.analysis.seeds SWEEP_DIR --a "scheduler=conserve" --b "scheduler=ampd" \\
        --metric ttfet_first_p95_s:-51.08 --metric tokens_per_joule:7.51 \\
        --min-seeds 3 --max-seeds 20 --target-halfwidth 0.1 [--cell NAME] [--margin 3] \\
        [--] [OVERRIDE ...]

A *cell* is one sweep point (the common ``OVERRIDE``s, e.g. ``workload.rate_per_s=0.1``) compared on two
arms, ``--a`` and ``--b`` (each a space-separated list of Hydra overrides, e.g. ``"scheduler=ampd
scheduler.mode=cost"``), paired on the seed. Each round runs ``python run.py -m`` once per arm over the seeds
0..n-1 into ``SWEEP_DIR/<cell>/<arm>_seed<k>/`` (``hydra.sweep.dir`` and a seed-keyed
``hydra.sweep.subdir``, so a rerun or a later round skips the runs already complete: run.py's resume) and
reads each run's ``summary.json``. Each ``run.py -m`` is owned by this process (``harness.core.children``): a
SIGTERM, SIGHUP or Ctrl-C stops it first (its job marked partial, its sweep lock released), and it gets SIGTERM
if this process is killed outright. The rounds are the planned looks of a group-sequential design
(:func:`planned_looks`: ``--min-seeds`` doubled until ``--max-seeds``, e.g. 3, 6, 12, 20). At each look, per
``--metric KEY[:PAPER]``, it computes the paired ratio a / b over the seeds with its *repeated confidence
interval* (:func:`harness.analysis.stats.ratio_interval` at Pocock's nominal level :func:`sequential_alpha`,
about 0.015 for 3, 6, 12, 20 seeds instead of 0.05) and, with the paper's effect in %, the verdict
(:func:`harness.analysis.stats.verdict`). A metric is done when

* ``target``: the log-ratio half-width ``t_{1-alpha'/2, n-1} sd / sqrt(n) <= --target-halfwidth`` (0.1 is
  about +-10 % on the ratio), or
* ``decided``: a verdict other than ``inconclusive``, from :data:`MIN_DECIDE_SEEDS` (10) seeds on (only with
  a paper effect; ``--no-stop-on-verdict``
  turns it off);

the cell stops (:func:`decide`) when every metric is done or at the last look (``cap``), else it runs the
next look. The repeated intervals hold at all looks at once, so stopping at any look for any of these
reasons keeps a false directional verdict at a true effect of 0 at most 5 % (measured: docs/metrics.md,
"Adaptive seeds").

Each cell's record (seeds run, why it stopped, per metric the estimate, interval, half-width, sign count
and verdict, and the rounds) is written to ``SWEEP_DIR/seeds.json`` (one entry per cell, updated in place)
and ``SWEEP_DIR/seeds.csv``; ``python -m harness.analysis.report SWEEP_DIR`` shows the table in ``report.md`` and
``claims.md``. Exit status: 0 when the cell stopped on its rule or the cap, 2 for bad arguments (a bound not finite
or out of range, a bad ``--metric``, before anything runs; or overrides ``run.py`` refuses, such as a rate that is
not a finite number > 0: it validates every job of an arm before it runs one), 1 when a run fails, 130 when
interrupted (Ctrl-C, SIGTERM; the rounds recorded so far stay in ``seeds.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from harness.core import cmdline
from harness.core.children import run_owned
from harness.core.paths import PROJECT_ROOT
from harness.analysis.stats import EQUIVALENCE_MARGIN_PCT, mean_ci, ratio_interval, verdict

SEED_KEY = "workload.seed"
RECORD_JSON, RECORD_CSV = "seeds.json", "seeds.csv"


def planned_looks(min_seeds: int, max_seeds: int) -> tuple[int, ...]:
    """The planned looks of the sequential design, in seeds: ``min_seeds`` doubled until ``max_seeds``,
    which is always the last (3, 20 -> ``(3, 6, 12, 20)``; 5, 5 -> ``(5,)``).

    Raises:
        ValueError: not ``2 <= min_seeds <= max_seeds``.
    """
    if not (2 <= min_seeds <= max_seeds):
        raise ValueError(f"need 2 <= --min-seeds ({min_seeds}) <= --max-seeds ({max_seeds})")
    looks, n = [], min_seeds
    while n < max_seeds:
        looks.append(n)
        n *= 2
    return tuple(looks + [max_seeds])


@lru_cache(maxsize=64)
def sequential_alpha(looks: tuple[int, ...], alpha: float = 0.05, reps: int = 200_000, seed: int = 0) -> float:
    """The nominal two-sided level of every look of a Pocock design for one-sample t-statistics: the
    ``alpha'`` such that, with no effect, the chance that the t-test at level ``alpha'`` rejects at *any*
    of the ``looks`` (seeds, increasing) is ``alpha``. Pocock's boundary is one constant nominal level for
    all looks (Pocock, "Group sequential methods in the design and analysis of clinical trials",
    Biometrika 64, 1977); with an unknown variance it is carried to the t-statistics by that nominal
    significance level (Jennison & Turnbull, Group Sequential Methods with Applications to Clinical
    Trials, 2000, sec. 3.8), here calibrated for these looks by simulation instead of the normal
    approximation: ``reps`` null paths of standard normal seeds (fixed ``seed``: reproducible), each look
    from its segments' sufficient statistics (a segment of ``L`` seeds: its sum ~ N(0, L) and its
    within-segment sum of squares ~ chi^2_{L-1}, independent), and ``alpha'`` the ``alpha``-quantile of the
    smallest p-value over the looks. One look: ``alpha`` itself. 3, 6, 12, 20 seeds: 0.0150 (t = 8.07,
    3.63, 2.88, 2.67 at the looks, against 4.30, 2.57, 2.20, 2.09 at 95 %; docs/metrics.md, "Adaptive
    seeds"); looks of 1000, 2000, 3000, 4000 give 0.0181, Pocock's normal-theory 0.0182 (his 2.361).
    Monte Carlo error: about +-0.0005 on the overall ``alpha`` at 200,000 paths.

    The intervals at this level are repeated confidence intervals (Jennison & Turnbull, JRSS B 51, 1989):
    with no effect they all cover it at once with probability ``1 - alpha``, so a stop at any look, for any
    reason (a decided verdict, a narrow interval, the cap), keeps the chance of a false directional verdict
    at most ``alpha``.

    Raises:
        ValueError: looks not increasing or the first below 2 seeds.
    """
    looks = tuple(int(n) for n in looks)
    if not looks or looks[0] < 2 or any(b <= a for a, b in zip(looks, looks[1:])):
        raise ValueError(f"sequential_alpha: looks must increase from at least 2 seeds, got {looks}")
    if len(looks) == 1:
        return float(alpha)
    from scipy import stats
    rng = np.random.default_rng(seed)
    total = np.zeros(reps)
    raw_ss = np.zeros(reps)      # sum of x^2 so far
    min_p = np.ones(reps)
    prev = 0
    for n in looks:
        seg = n - prev
        ssum = rng.normal(0.0, math.sqrt(seg), reps)
        within = rng.chisquare(seg - 1, reps) if seg > 1 else np.zeros(reps)
        total += ssum
        raw_ss += within + ssum ** 2 / seg
        ss = np.maximum(raw_ss - total ** 2 / n, 1e-300)
        t = total / np.sqrt(n * ss / (n - 1))
        min_p = np.minimum(min_p, 2 * stats.t.sf(np.abs(t), n - 1))
        prev = n
    return float(np.quantile(min_p, alpha))


@dataclass
class MetricState:
    """One metric of a cell after a round: ``estimate`` and ``low`` / ``high`` in % change of the ratio
    a / b (the repeated confidence interval of the look: level ``1 - alpha``), ``halfwidth`` of the mean
    log ratio at that level (dimensionless), ``n`` seeds, ``k`` seeds on the estimate's side, ``verdict``
    (empty without a paper effect), ``done`` and ``why`` (``target`` / ``decided`` / ''), ``alpha`` the
    look's nominal two-sided level (:func:`sequential_alpha`)."""

    metric: str
    paper: Optional[float]
    estimate: float
    low: float
    high: float
    halfwidth: float
    n: int
    k: int
    verdict: str
    done: bool
    why: str
    alpha: float = 0.05


def metric_state(metric: str, log_ratios: Sequence[float], paper: Optional[float], target: float,
                 margin: float = EQUIVALENCE_MARGIN_PCT, stop_on_verdict: bool = True,
                 alpha: float = 0.05) -> MetricState:
    """The stopping state of one metric from its per-seed log ratios ``log(a_i / b_i)``: the interval at the
    nominal two-sided level ``alpha`` (the look's :func:`sequential_alpha`; 0.05 is a fixed design's 95 %),
    its verdict (:func:`harness.analysis.stats.verdict`) and whether the metric is done (``target``: the
    half-width at most ``target``; ``decided``: a verdict other than ``inconclusive``)."""
    z = np.asarray([x for x in log_ratios if np.isfinite(x)], dtype=float)
    est, (lo, hi), n, k = ratio_interval(z, alpha)
    _, half, _ = mean_ci(z, alpha)
    v = verdict(est, (lo, hi), paper, margin) if paper is not None else ""
    why = ("target" if np.isfinite(half) and half <= target
           else "decided" if stop_on_verdict and v not in ("", "inconclusive") else "")
    return MetricState(metric, paper, est, lo, hi, float(half), n, k, v, bool(why), why, float(alpha))


def next_seeds(n: int, looks: Sequence[int]) -> int:
    """The seeds of the next round: the first planned look after ``n`` (the last look when none is)."""
    return int(next((m for m in looks if m > n), looks[-1]))


def decide(states: Sequence[MetricState], n: int, max_seeds: int) -> str:
    """Why the cell stops after a round of ``n`` seeds (``target``, ``decided``, ``target+decided``, ``cap``),
    or '' to go on."""
    if states and all(s.done for s in states):
        return "+".join(sorted({s.why for s in states}, key=["target", "decided"].index))
    return "cap" if n >= max_seeds else ""


# A decided verdict stops a cell only from this many seeds on (the floor of ``round_decision``). Why: on a skewed
# null (per-seed log ratios with a long tail on one side, as where one seed of the pair collapses) the repeated
# t-intervals of small looks are too short on the tail's other side, and stopping there on a "decided" verdict
# gave 8.2 % false directional verdicts (a shifted log-normal, sd 0.3, skewness 1.75, the shape of the C1 cell:
# 7.8 % measured before on that shape); with the floor at 10 seeds, 4.3 % (tests/test_seeds_sequential.py; docs/metrics.md "Adaptive
# seeds"). The half-width target and the cap still stop a cell at any look.
MIN_DECIDE_SEEDS = 10


def round_decision(log_ratios: dict[str, Sequence[float]], metrics: Sequence[tuple[str, Optional[float]]],
                   n: int, looks: Sequence[int], target: float, margin: float = EQUIVALENCE_MARGIN_PCT,
                   stop_on_verdict: bool = True,
                   min_decide: int = MIN_DECIDE_SEEDS) -> tuple[list[MetricState], str, int]:
    """One look of the sequential design on ``n`` seeds: ``(states, why, next n)`` -- each metric's state
    (:func:`metric_state` at the looks' :func:`sequential_alpha`), why the cell stops (:func:`decide`; ''
    to go on) and the next look (:func:`next_seeds`). A decided verdict stops the cell only when ``n >=
    min_decide`` (:data:`MIN_DECIDE_SEEDS`; the cap and the half-width target at any look). :func:`adapt` runs
    it after every round; the tests run it on synthetic log ratios."""
    a = sequential_alpha(tuple(looks))
    on_verdict = stop_on_verdict and n >= min_decide
    states = [metric_state(m, log_ratios[m], p, target, margin, on_verdict, a) for m, p in metrics]
    return states, decide(states, n, looks[-1]), next_seeds(n, looks)


@dataclass
class CellRecord:
    """What ``seeds.json`` keeps per cell (``looks``: the planned looks in seeds; ``alpha``: their nominal
    two-sided level, :func:`sequential_alpha`)."""

    cell: str
    a: list[str]
    b: list[str]
    overrides: list[str]
    min_seeds: int
    max_seeds: int
    target_halfwidth: float
    margin: float
    seeds: int = 0
    stopped: str = ""
    metrics: list[dict] = field(default_factory=list)
    rounds: list[dict] = field(default_factory=list)
    looks: list[int] = field(default_factory=list)
    alpha: float = 0.05


def _label(overrides: Sequence[str]) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", "_".join(overrides)).strip("-") or "base"


def parse_metric(text: str) -> tuple[str, Optional[float]]:
    """``KEY`` or ``KEY:PAPER`` (the paper's effect in %) -> ``(key, paper)``.

    Raises:
        ValueError: an empty key or a PAPER that is not a finite number.
    """
    key, _, paper = text.partition(":")
    if not key:
        raise ValueError(f"--metric {text!r}: empty key")
    try:
        return key, (cmdline.parse_number(paper) if paper else None)
    except ValueError:
        raise ValueError(f"--metric {text!r}: the paper's effect after ':' must be a finite number (%)") from None


def check_overrides(a: Sequence[str], b: Sequence[str], overrides: Sequence[str]) -> None:
    """Check a cell's overrides before anything runs: no ``workload.seed`` (the seeds are this tool's) and no sweep
    (a cell is one point). (Their values are checked by ``run.py`` itself, which validates every job of a sweep
    before it runs one and exits 2: :class:`RunFailed`.)

    Raises:
        ValueError: naming the override.
    """
    for o in (*a, *b, *overrides):
        if o.split("=", 1)[0].lstrip("+~") == SEED_KEY or "," in o.split("=", 1)[-1]:
            raise ValueError(f"override {o!r}: the seeds are this tool's, and a cell is one point (no sweeps)")


class RunFailed(RuntimeError):
    """``run.py`` exited non-zero for an arm: ``returncode`` its exit status (2: it refused the arm's config and ran
    nothing, run.py's bad input), ``stderr`` the tail of its error output."""

    def __init__(self, message: str, returncode: int, stderr: str):
        super().__init__(message)
        self.returncode, self.stderr = returncode, stderr


def run_arm(cell_dir: Path, arm: Sequence[str], overrides: Sequence[str], seeds: int | Sequence[int],
            python: str = sys.executable) -> None:
    """``python run.py -m`` of one arm over the seeds 0..seeds-1 (``seeds`` an int; a sequence: those seeds, e.g.
    tuning seeds apart from the verdict's) into ``cell_dir/<arm>_seed<k>`` (complete
    runs are skipped by run.py). The child is owned (``harness.core.children.run_owned``): a SIGTERM, SIGHUP
    or Ctrl-C to this process stops it (run.py marks the job partial and releases the sweep lock) before this
    process goes on to exit, and it gets SIGTERM if this process dies.

    Raises:
        RunFailed: run.py exited with a non-zero status (its stderr's tail in the message).
        KeyboardInterrupt: Ctrl-C, or ``harness.core.children.Terminated`` (SIGTERM / SIGHUP), once the
            child is gone.
    """
    seed_list = range(seeds) if isinstance(seeds, int) else seeds
    cmd = [python, str(PROJECT_ROOT / "run.py"), "-m", *overrides, *arm,
           f"{SEED_KEY}={','.join(str(s) for s in seed_list)}",
           f"hydra.sweep.dir={cell_dir}", f"hydra.sweep.subdir={_label(arm)}_seed${{{SEED_KEY}}}"]
    p = run_owned(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT)   # stopped with this process
    if p.returncode != 0:
        raise RunFailed(f"run.py exited {p.returncode}: {' '.join(cmd)}\n{p.stderr[-2000:]}", p.returncode,
                        p.stderr[-2000:])


def read_arm(cell_dir: Path, arm: Sequence[str], seeds: int, metrics: Sequence[str]) -> dict[int, dict]:
    """``{seed: {metric: value}}`` from ``cell_dir/<arm>_seed<k>/summary.json`` (NaN where missing)."""
    out = {}
    for s in range(seeds):
        p = cell_dir / f"{_label(arm)}_seed{s}" / "summary.json"
        summary = json.loads(p.read_text()) if p.is_file() else {}
        out[s] = {m: float(summary[m]) if isinstance(summary.get(m), (int, float)) else math.nan for m in metrics}
    return out


def log_ratios(a: dict[int, dict], b: dict[int, dict], metric: str) -> list[float]:
    """Per seed present in both arms: ``log(a / b)`` of ``metric`` (NaN where either is missing or <= 0)."""
    out = []
    for s in sorted(set(a) & set(b)):
        x, y = a[s][metric], b[s][metric]
        out.append(math.log(x / y) if x > 0 and y > 0 else math.nan)
    return out


def write_records(sweep_dir: Path, rec: CellRecord) -> None:
    """Insert or replace ``rec`` in ``sweep_dir/seeds.json`` and rewrite ``seeds.csv`` (one row per cell
    and metric)."""
    import pandas as pd
    p = sweep_dir / RECORD_JSON
    cells = json.loads(p.read_text()) if p.is_file() else []
    cells = [c for c in cells if c.get("cell") != rec.cell] + [asdict(rec)]
    p.write_text(json.dumps(cells, indent=1))
    rows = [{"cell": c["cell"], "seeds": c["seeds"], "stopped": c["stopped"], **m} for c in cells for m in c["metrics"]]
    pd.DataFrame(rows).to_csv(sweep_dir / RECORD_CSV, index=False)


def seeds_markdown(sweep_dir: Path) -> str:
    """The ``seeds.csv`` of ``sweep_dir`` as a markdown section ('' when there is none)."""
    p = Path(sweep_dir) / RECORD_CSV
    if not p.is_file():
        return ""
    import pandas as pd
    t = pd.read_csv(p)
    lines = ["## Seeds per cell (`python -m harness.analysis.seeds`)", "",
             "Seeds were added to each cell at planned looks until every metric's paired interval was narrow enough "
             "(`target`: half-width of the mean log ratio at most the target), its verdict was decided (`decided`), "
             "or the last look was reached (`cap`). The intervals are repeated 95 % confidence intervals (Pocock's "
             "nominal level α' at every look, docs/metrics.md \"Adaptive seeds\"), wider than a fixed design's.", "",
             "| cell | seeds | stopped | metric | a / b − 1 [repeated 95 % interval] | log half-width | sign count | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    for r in t.itertuples():
        ci = (f"{r.estimate:+.1f} % [{r.low:+.1f}, {r.high:+.1f}]" if np.isfinite(r.low)
              else f"{r.estimate:+.1f} %")
        lines.append(f"| {r.cell} | {r.seeds} | {r.stopped} | `{r.metric}` | {ci} | {r.halfwidth:.3f} | "
                     f"{r.k} of {r.n} | {r.verdict if isinstance(r.verdict, str) else ''} |")
    return "\n".join(lines) + "\n"


def adapt(sweep_dir: Path, a: Sequence[str], b: Sequence[str], overrides: Sequence[str],
          metrics: Sequence[tuple[str, Optional[float]]], min_seeds: int = 3, max_seeds: int = 20,
          target_halfwidth: float = 0.1, margin: float = EQUIVALENCE_MARGIN_PCT, cell: Optional[str] = None,
          stop_on_verdict: bool = True, runner=run_arm, log=print) -> CellRecord:
    """Run one cell round by round (module docstring) and return its record (also written to
    ``seeds.json`` / ``seeds.csv`` after every round, so an interruption loses nothing measured).
    ``runner(cell_dir, arm, overrides, seeds)``: runs an arm (default :func:`run_arm`; tests pass a fake).

    Raises:
        ValueError: bad bounds (``1 < min_seeds <= max_seeds``, ``target_halfwidth > 0``) or no metric.
    """
    looks = planned_looks(min_seeds, max_seeds)
    if not target_halfwidth > 0:
        raise ValueError(f"--target-halfwidth must be > 0, got {target_halfwidth}")
    if not metrics:
        raise ValueError("at least one --metric")
    check_overrides(a, b, overrides)
    sweep_dir = Path(sweep_dir)
    cell = cell or _label(overrides)
    cell_dir = sweep_dir / cell
    rec = CellRecord(cell, list(a), list(b), list(overrides), min_seeds, max_seeds, target_halfwidth, margin)
    keys = [m for m, _ in metrics]
    rec.looks, rec.alpha = list(looks), sequential_alpha(looks)
    n = looks[0]
    while True:
        for arm in (a, b):
            runner(cell_dir, arm, overrides, n)
        va, vb = read_arm(cell_dir, a, n, keys), read_arm(cell_dir, b, n, keys)
        lr = {m: log_ratios(va, vb, m) for m in keys}
        states, why, nxt = round_decision(lr, metrics, n, looks, target_halfwidth, margin, stop_on_verdict)
        rec.seeds, rec.stopped, rec.metrics = n, why, [asdict(s) for s in states]
        rec.rounds.append({"seeds": n, **{s.metric: {"halfwidth": s.halfwidth, "verdict": s.verdict} for s in states}})
        write_records(sweep_dir, rec)
        log(f"{cell}: {n} seeds; " + "; ".join(f"{s.metric} {s.estimate:+.1f} % [{s.low:+.1f}, {s.high:+.1f}] "
                                              f"h={s.halfwidth:.3f} {s.verdict}" for s in states)
            + (f" -> stop ({why})" if why else ""))
        if why:
            return rec
        n = nxt


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = cmdline.ArgumentParser(prog="python -m harness.analysis.seeds", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("sweep_dir", type=cmdline.writable(directory=True),
                    help="the sweep directory (cells go to SWEEP_DIR/<cell>/)")
    ap.add_argument("overrides", nargs="*", help="the cell's common Hydra overrides (one point, no sweeps)")
    ap.add_argument("--a", required=True, help='arm a (numerator), space-separated overrides, e.g. "scheduler=conserve"')
    ap.add_argument("--b", required=True, help='arm b (denominator), e.g. "scheduler=ampd scheduler.mode=cost"')
    ap.add_argument("--metric", action="append", required=True, metavar="KEY[:PAPER]",
                    help="a summary.json key, optionally with the paper's effect in %% (repeatable)")
    ap.add_argument("--min-seeds", type=cmdline.number(2, integer=True), default=3,
                    help="the first look (seeds, >= 2); later looks double it")
    ap.add_argument("--max-seeds", type=cmdline.number(2, integer=True), default=20,
                    help="the last look (seeds, >= --min-seeds), the cap")
    ap.add_argument("--target-halfwidth", type=cmdline.number(0, lo_open=True), default=0.1,
                    help="stop when the mean log ratio's repeated 95 %% half-width is at most this "
                         "(0.1: about +-10 %%)")
    ap.add_argument("--margin", type=cmdline.number(0), default=EQUIVALENCE_MARGIN_PCT,
                    help="the verdict's equivalence margin in %% (harness.analysis.stats.EQUIVALENCE_MARGIN_PCT)")
    ap.add_argument("--cell", default=None, help="the cell's name (default: from the overrides)")
    ap.add_argument("--no-stop-on-verdict", action="store_true", help="stop on the half-width or the cap only")
    args = ap.parse_args(argv)
    if args.min_seeds > args.max_seeds:
        ap.error(f"--min-seeds {args.min_seeds} > --max-seeds {args.max_seeds}")
    try:
        metrics = [parse_metric(m) for m in args.metric]
        check_overrides(args.a.split(), args.b.split(), args.overrides)
    except ValueError as e:
        ap.error(str(e))
    try:
        rec = adapt(args.sweep_dir, args.a.split(), args.b.split(), args.overrides, metrics, args.min_seeds,
                    args.max_seeds, args.target_halfwidth, args.margin, args.cell, not args.no_stop_on_verdict)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        if e.returncode == 2:   # run.py refused the arm's overrides before running anything: bad input, one line
            said = [ln.strip() for ln in e.stderr.splitlines() if ln.strip()]
            why = next((ln for ln in said if ln.startswith("job ")), next(
                (ln[len("error: "):] for ln in reversed(said) if ln.startswith("error: ")), said[-1] if said else ""))
            print(f"error: run.py refused the cell's overrides (nothing of that arm was run): {why}", file=sys.stderr)
            return 2
        print(f"error: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{rec.cell}: stopped after {rec.seeds} seeds ({rec.stopped}); -> {args.sweep_dir / RECORD_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(cmdline.run(main))
