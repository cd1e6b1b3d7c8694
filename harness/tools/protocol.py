"""The fidelity protocol's rules (run by ``python -m harness.tools.fidelity protocol``,
``harness.tools.fidelity.protocol``): a calibration run, the per-step fit, then >= 3 held-out repeats back to back
on launched servers, judged on vLLM's engine and server clocks beside the real side's own spread -- and refused
when the machine, not the server, was measured. This module holds the rules as pure functions and the figures a run
is judged by; ``harness.tools.fidelity`` runs them.

Each real run (the calibration and every held-out repeat) records the machine's 1-minute load average
(``os.getloadavg``) just before and just after it, the hypervisor's steal share over it (``/proc/stat``; shown, not
bounded), and its own step-time dispersion (the pooled within-composition IQR / median of its decode-only steps from
the servers' step-time logs, ``harness.tools.steps.dispersion``; the first ``skip_steps`` steps per instance, the
warm-up, left out). Before each run the protocol waits up to ``SETTLE_S`` for the load average to settle under the
*before* bound (the previous run's own load decays with the average's 60 s time constant: measure the machine idle,
not the tail of our own last run). :func:`contention_problem` names the first figure over its bound; the protocol
then stops (exit 2) before it fits or judges anything, having written what it measured so far to ``protocol.json``.
A load average still over the bound *before* a run after the wait refuses that run before it is launched.

Bounds (stated here, in ``--help`` and docs/fidelity_cpu.md "The protocol"; measured on the 2-CPU machine,
2026-12-03):

* the 1-minute load average **before** a run, settled, at most ``MAX_LOAD_BEFORE_PER_CPU`` (0.35) x the CPUs: the
  idle machine read 0.08 before the first calibration; one CPU-bound process alone holds it at 1.0 (0.5 per CPU on
  2 CPUs) once its minute has passed;
* the 1-minute load average **after** a run, the run's own load included, at most ``MAX_LOAD_AFTER_PER_CPU`` (1.5)
  x the CPUs: the quiet protocol runs read 1.02-2.25 after a run (engine core, its worker, API server, client; the
  earlier bound of 1.0 per CPU refused a quiet calibration at 2.25), one more CPU-bound process adds about 1;
* the decode-step dispersion at most ``MAX_DISPERSION`` (25 %: 6.2-16.5 % on quiet calibration runs, 15.7-28.7 % on
  quiet held-out repeats, 18-32 % per regime at a load average of 10, docs/fidelity_cpu.md), ``harness.tools.steps``'s
  bound, the one ``fidelity steps`` and ``calibrate --from-steps`` refuse with;
* the slow-period figure at most ``MAX_SLOW_PERIODS`` (1.10; ``harness.tools.steps.slow_periods``): the
  busy-time-weighted over step-weighted speed ratio of 0.5 s busy-time windows against the run's own in-sample fit,
  which sees correlated (slow-period) machine noise that the dispersion does not (shipped calibration 1.030, the same
  log at half speed for 60 of every 200 steps 1.144, independent noise of sigma 0.3 1.049);
* the in-sample step count within ``MAX_INSAMPLE_STEPS`` (8 %; ``harness.tools.insample``): the run's own log fitted
  on itself and its workload replayed; a machine that slows the API server and the client but not the pinned engine
  changes how the real engine batches, which the step-speed figures cannot see. Quiet runs: -4.7 to +1.8 % (five
  shipped logs; the replay's own floor on them 2.0-3.8 %); beside one / two CPU-bound processes -11.7 / -14.8 %
  while their slow-period figures (1.051 / 1.048) accept them (docs/fidelity_cpu.md "In sample, every shipped log").

Judging (pure functions, :func:`repeat_spread`, :func:`verdict`, :func:`protocol_rows`): per metric the simulator's
error against the mean of the real repeats, ``err = sim / mean(real) - 1`` (the simulated replay is the same for
every repeat: same workload and seed), and the real side's spread ``(max - min) / mean`` over the >= ``MIN_REPEATS``
repeats. Verdicts:

* ``missed``: ``|err| > target`` and ``|err| >= spread`` (off by more than the target and more than the real side
  varies);
* ``unresolved``: otherwise, when ``spread >= target`` (the real side's own spread is as large as the target: the
  target cannot be checked on these runs, whatever the error);
* ``within noise``: ``|err| < spread`` (and ``spread < target``);
* ``met``: ``spread <= |err| <= target``;
* ``no data``: the error or the spread is not finite (fewer than ``MIN_REPEATS`` repeats with the metric).

Deciding metrics (:data:`DECIDING`, the field's targets: mean E2E and mean ITL within 10 %, mean TTFT within 20 %;
anchors ``harness.tools.fidelity.ANCHORS``): on the engine clock, per request from vLLM's spans
(``engine_e2e_mean_s``: queue + prefill + decode, ``engine_ttft_mean_s``: queue + prefill, ``engine_itl_mean_s``:
decode / (output - 1); ``harness.tools.replay.engine_request_rows``), and on the server clock, vLLM's histograms
(``server_e2e_mean_s``, ``server_ttft_mean_s`` from the API server's arrival, ``server_itl_mean_s``). The client
clock (``e2e_mean_s``, ``ttft_mean_s``, ``tpot_mean_s``, :data:`SHOWN`) is computed and shown with its verdict, and
never decides: the client's legs (HTTP, streaming delivery) are in no step model and move with the machine.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from harness.tools import steps as st

MIN_REPEATS = 3
MAX_LOAD_BEFORE_PER_CPU = 0.35   # the idle machine, settled (module docstring)
MAX_LOAD_AFTER_PER_CPU = 1.5     # the run's own load included (module docstring)
MAX_LOAD_PER_CPU = MAX_LOAD_BEFORE_PER_CPU
MAX_DISPERSION = st.MAX_DISPERSION
MAX_SLOW_PERIODS = st.MAX_SLOW_PERIODS   # the slow-period figure's bound (harness.tools.steps.slow_periods)
MAX_INSAMPLE_STEPS = 0.08        # |in-sample step-count error| bound (module docstring; harness.tools.insample)
SETTLE_S = 180.0                 # the longest wait for the load average to settle before a run, s
SETTLE_POLL_S = 5.0              # os.getloadavg's own update period, s
# the field's targets (harness.tools.fidelity.TARGETS), per clock: these decide
DECIDING = {"engine_e2e_mean_s": 0.10, "engine_ttft_mean_s": 0.20, "engine_itl_mean_s": 0.10,
            "server_e2e_mean_s": 0.10, "server_ttft_mean_s": 0.20, "server_itl_mean_s": 0.10}
# the client's clock: shown with a verdict, never deciding
SHOWN = {"e2e_mean_s": 0.10, "ttft_mean_s": 0.20, "tpot_mean_s": 0.10}
PASS = ("met", "within noise")
CALIBRATION_OVERRIDES = ("backend=vllm", "model=tiny", "cluster=cpu_1x", "scheduler=collocated", "slo=absolute",
                         "engine.block_size=128", "workload=calibration_steps_cpu")


def clock(metric: str) -> str:
    """``engine``, ``server`` or ``client``: the clock a compared metric is read on."""
    return "engine" if metric.startswith("engine_") else "server" if metric.startswith("server_") else "client"


# ---- the rules (pure functions) ---------------------------------------------------------------------------------

def contention_problem(figures: dict, max_load_per_cpu: float = MAX_LOAD_BEFORE_PER_CPU,
                       max_dispersion: float = MAX_DISPERSION,
                       max_load_after_per_cpu: float = MAX_LOAD_AFTER_PER_CPU,
                       max_slow_periods: float = MAX_SLOW_PERIODS,
                       max_insample_steps: float = MAX_INSAMPLE_STEPS) -> str:
    """Why one real run's figures show a contended machine, or ``""``.

    Args:
        figures: ``ncpu`` (the machine's CPUs); any of ``loadavg_before``, ``loadavg_after`` (1-minute load
            average just before / after the run); ``step_dispersion`` (IQR / median of decode-step times within a
            composition, a fraction) with ``dispersion_steps`` (the steps it rests on); ``slow_periods`` (the
            busy-time-weighted over step-weighted window speed ratio, ``harness.tools.steps.slow_periods``, against
            the run's own in-sample fit: correlated slow periods of the machine); ``insample_steps`` (the in-sample
            replay's step-count error, ``sim / real - 1``, ``harness.tools.insample``). A figure left out (or NaN, for
            ``slow_periods`` and ``insample_steps``) is not
            checked (before a run only its ``loadavg_before`` exists); ``run`` names the run in the message.
        max_load_per_cpu: bound of the load average before a run, per CPU. max_dispersion: bound of the
            dispersion. max_load_after_per_cpu: bound of the load average after a run (its own load included),
            per CPU. max_slow_periods: bound of ``slow_periods``. max_insample_steps: bound of ``|insample_steps|``.

    Returns the first figure over its bound, with its value and the bound (load before, load after, dispersion,
    slow periods, in-sample steps);
    a ``step_dispersion`` that is NaN (no composition was seen 3 times: the run's quietness cannot be shown) is a
    problem too.

    Raises:
        ValueError: a bound that is not a finite number > 0, or ``max_slow_periods`` below 1 (a NaN bound would
            pass every figure).
    """
    from harness.core.cmdline import check_number
    for name, b in (("max_load_per_cpu", max_load_per_cpu), ("max_dispersion", max_dispersion),
                    ("max_load_after_per_cpu", max_load_after_per_cpu)):
        check_number(name, b, 0, lo_open=True)
    check_number("max_slow_periods", max_slow_periods, 1)
    check_number("max_insample_steps", max_insample_steps, 0, lo_open=True)
    run = figures.get("run", "the run")
    for k, when, per_cpu in (("loadavg_before", "before", max_load_per_cpu),
                             ("loadavg_after", "after", max_load_after_per_cpu)):
        v = figures.get(k)
        bound = per_cpu * figures["ncpu"]
        if v is not None and v > bound:
            return (f"1-minute load average {v:.2f} {when} {run} > bound {bound:.2f} ({per_cpu:g} x "
                    f"{figures['ncpu']} CPUs): the machine was contended; rerun on a quiet machine")
    if "step_dispersion" in figures:
        d, n = figures["step_dispersion"], figures.get("dispersion_steps", 0)
        if not math.isfinite(d):
            return (f"decode step-time dispersion of {run} not measurable (no decode composition seen 3 times): "
                    f"its quietness cannot be shown (bound {max_dispersion:.0%})")
        if d > max_dispersion:
            return (f"decode step-time dispersion {d:.1%} of {run} (IQR / median within a composition, {n} steps) "
                    f"> bound {max_dispersion:.0%}: the machine was contended; rerun on a quiet machine")
    v = figures.get("slow_periods")
    if v is not None and math.isfinite(v) and v > max_slow_periods:
        return (f"slow-period figure {v:.3f} of {run} (busy-time-weighted over step-weighted speed ratio of "
                f"{st.SLOW_WINDOW_S:g} s windows against its own in-sample fit) > bound {max_slow_periods:.2f}: the "
                f"machine was slow for periods (correlated noise); rerun on a quiet machine")
    v = figures.get("insample_steps")
    if v is not None and math.isfinite(v) and abs(v) > max_insample_steps:
        return (f"in-sample step count of {run} off by {v:+.1%} (its own log fitted on itself and replayed) > bound "
                f"{max_insample_steps:.0%}: the real engine batched as an undisturbed one would not (a slowed API "
                f"server or client); rerun on a quiet machine")
    return ""


def steal_share(before: Optional[dict], after: Optional[dict]) -> float:
    """The hypervisor's steal share between two :func:`cpu_times` readings: ``steal / total`` of the jiffies that
    passed (a fraction; NaN when either reading is missing or no time passed). Shown beside a run's figures, not
    bounded: a VM whose host takes its CPUs slows every step without raising the load average."""
    if not before or not after:
        return math.nan
    total = sum(after.values()) - sum(before.values())
    return (after["steal"] - before["steal"]) / total if total > 0 else math.nan


def cpu_times(path: str = "/proc/stat") -> Optional[dict]:
    """The machine's CPU time so far, jiffies per state (``user nice system idle iowait irq softirq steal``: the
    first line of ``/proc/stat``, proc(5)); None where the file does not exist (not Linux)."""
    try:
        first = Path(path).read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {k: int(v) for k, v in zip(names, first[1:])}


def settle(bound: float, wait_s: float = SETTLE_S, poll_s: float = SETTLE_POLL_S,
           sleep=time.sleep, clock=time.monotonic) -> tuple:
    """Wait until the 1-minute load average is at most ``bound`` (load units, not per CPU), at most ``wait_s`` s,
    reading it every ``poll_s`` s. Returns ``(machine_state(), waited s)``: the state last read (over the bound when
    the wait ran out)."""
    t0 = clock()
    state = machine_state()
    while state["loadavg"][0] > bound and clock() - t0 < wait_s:
        sleep(min(poll_s, max(0.0, wait_s - (clock() - t0))))
        state = machine_state()
    return state, clock() - t0


def repeat_spread(values: Sequence[float], min_repeats: int = MIN_REPEATS) -> float:
    """The real side's own spread over repeats: ``(max - min) / mean`` of the finite ``values`` (one per repeat, any
    unit); NaN with fewer than ``min_repeats`` of them or a mean of 0."""
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=float)
    if len(v) < min_repeats or v.mean() == 0:
        return math.nan
    return float((v.max() - v.min()) / v.mean())


def verdict(err: float, spread: float, target: float) -> str:
    """One metric's verdict from its error ``sim / mean(real) - 1``, the real side's spread (:func:`repeat_spread`)
    and the target (fractions): ``missed``, ``unresolved``, ``within noise``, ``met`` or ``no data``; the rules in
    the module docstring ("within noise" only when the spread itself is under the target)."""
    if not (math.isfinite(err) and math.isfinite(spread)):
        return "no data"
    e = abs(err)
    if e > target and e >= spread:
        return "missed"
    if spread >= target:
        return "unresolved"
    return "within noise" if e < spread else "met"


def protocol_rows(repeats: Sequence[dict], deciding: Optional[dict] = None, shown: Optional[dict] = None,
                  min_repeats: int = MIN_REPEATS) -> dict:
    """Per metric of ``deciding`` and ``shown`` (``{metric: target}``; default :data:`DECIDING`, :data:`SHOWN`):
    ``real`` (one value per repeat, s), ``sim`` (the mean of the repeats' simulated values, s), ``err`` (``sim /
    mean(real) - 1``), ``err_per_repeat``, ``spread`` (:func:`repeat_spread`), ``target``, ``clock``
    (:func:`clock`), ``origin`` (what the times count from on each side, as the repeats' rows say:
    ``harness.tools.fidelity.origin``; the distinct ones joined by " | " if they differ), ``deciding`` (bool) and
    ``verdict`` (:func:`verdict`).

    Args: repeats: one ``harness.tools.fidelity.compare(...)["metrics"]`` dict per held-out repeat
    (``{metric: {"real", "sim", "err"}}``).
    """
    deciding = DECIDING if deciding is None else deciding
    shown = SHOWN if shown is None else shown
    out = {}
    for k, tol in [*deciding.items(), *shown.items()]:
        real = [float(r.get(k, {}).get("real", math.nan)) for r in repeats]
        sims = [s for s in (float(r.get(k, {}).get("sim", math.nan)) for r in repeats) if math.isfinite(s)]
        fin = [x for x in real if math.isfinite(x)]
        sim = float(np.mean(sims)) if sims else math.nan
        mean_real = float(np.mean(fin)) if fin else math.nan
        err = sim / mean_real - 1 if math.isfinite(sim) and math.isfinite(mean_real) and mean_real else math.nan
        spread = repeat_spread(real, min_repeats)
        origins = list(dict.fromkeys(r[k]["origin"] for r in repeats if r.get(k, {}).get("origin")))
        out[k] = {"real": real, "sim": sim, "err": err,
                  "err_per_repeat": [float(r.get(k, {}).get("err", math.nan)) for r in repeats],
                  "spread": spread, "target": tol, "clock": clock(k), "origin": " | ".join(origins),
                  "deciding": k in deciding,
                  "verdict": verdict(err, spread, tol)}
    return out


def flips(rows_by_choice: dict) -> list:
    """The metrics whose verdict word differs between the choices of one modelling knob: ``rows_by_choice`` maps
    each choice to its :func:`protocol_rows`; a metric missing under a choice counts as differing. Ordered as the
    first choice's rows."""
    rows = list(rows_by_choice.values())
    if not rows:
        return []
    keys = list(rows[0]) + [k for r in rows[1:] for k in r if k not in rows[0]]
    return [k for k in keys if len({r[k]["verdict"] if k in r else None for r in rows}) > 1]


def decision(rows: dict) -> int:
    """Exit status of a judged protocol: 0 when every deciding row (``protocol_rows``) is ``met`` or ``within noise``
    (and there is at least one), else 1. The client-clock rows never count."""
    d = [r["verdict"] for r in rows.values() if r["deciding"]]
    return 0 if d and all(v in PASS for v in d) else 1


# ---- running it -------------------------------------------------------------------------------------------------

def machine_state() -> dict:
    """The machine now: load average (1, 5, 15 min; ``os.getloadavg``), its CPUs (``os.cpu_count``), this process's
    CPU affinity, the time (s since the epoch) and the CPU time per state (:func:`cpu_times`, jiffies)."""
    return {"loadavg": list(os.getloadavg()), "ncpu": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "t_unix_s": time.time(), "cpu_jiffies": cpu_times()}


def run_steps(run_dir: Path, skip_steps: int) -> tuple:
    """``(steps, decode-step dispersion, steps it rests on)`` of a launched run's step-time logs
    (``harness.tools.steps.load_step_times``, ``dispersion``).

    Raises:
        FileNotFoundError: no step-time log (not launched, or without ``logger.steps=true``).
    """
    steps, _ = st.load_step_times(run_dir, skip_steps)
    d, n = st.dispersion(steps[steps.prefill_tokens == 0])
    return steps, d, n


def _pct(v: float) -> str:
    return "n/a" if not math.isfinite(v) else f"{v:+.1%}"


def rows_text(rows: dict) -> str:
    """The judged rows as a plain table (what the command prints)."""
    lines = [f"{'metric':22s} {'clock':7s} {'error':>8s} {'spread':>8s} {'target':>7s}  verdict  [origin]"]
    for k, r in rows.items():
        sp = "n/a" if not math.isfinite(r["spread"]) else f"{r['spread']:.1%}"
        v = r["verdict"] if r["deciding"] else f"({r['verdict']}; client clock: shown, not deciding)"
        o = f"  [{r['origin']}]" if r.get("origin") else ""
        lines.append(f"{k:22s} {r['clock']:7s} {_pct(r['err']):>8s} {sp:>8s} {r['target']:>7.0%}  {v}{o}")
    return "\n".join(lines)
