"""Per-step records of the simulated engines: ``steps.parquet`` (opt-in, ``logger.steps=true``).

One row per engine step, per instance, with the columns of ``STEP_COLUMNS``:

* ``instance`` (name), ``step`` (0, 1, 2, ... per instance, in time order);
* ``start_s``, ``duration_s`` (s of simulated time), ``energy_j`` (J) and ``power_w = energy_j /
  duration_s`` (W) of the step, from the step-time and power model (``harness.sim.perf``);
* ``prefill_tokens``: prompt tokens computed in the step (every chunk; recomputation after a preemption
  included); ``decode_tokens``: decode sequences advanced (one token each; the first output token,
  sampled by the step that completes a prompt, is a prefill step's token and is not counted here);
* ``batch_size``: requests the step advanced (prefill chunks + decode sequences); ``paused``: resident
  requests (running, KV kept) the step's batch rule left out (``harness.core.batching``; 0 under vLLM's own
  rules unless a step is limited by its token budget or ``max_num_seqs``);
* ``kv_tokens_read``: cached KV tokens read by attention: each prefill chunk's prefix (tokens computed
  before it) plus each decode sequence's context (its computed tokens). The KV written (one token per
  computed token) is not included. A decode step of one sequence whose prompt of P tokens and first j
  output tokens are computed reads P + j - 1 tokens (the token it processes is the last one sampled).

The engine simulates a run of identical decode-only steps as one event (``Engine._plan_decode_run``).
The log stores one record per run (O(1) per event, nothing per step) and expands it when the frame is
built: step ``j`` of a run of ``b`` sequences whose contexts sum to ``ctx`` is the decode step of
``b`` sequences with contexts summing to ``ctx + j * b``, costed by ``PerfModel.decode_run(b, ctx + j*b,
1, inf)`` -- the very call step-by-step simulation (``backend.max_coalesce_s=0``) makes for that step, so
durations and energies are identical, and start times are accumulated step by step (``start + duration``,
as the event clock does). Only ``start_s`` can differ from step-by-step simulation, in the last bits,
because a coalesced run's end is the run start plus a cumulative sum (``tests/test_steps.py``).

When ``logger.steps`` is false no log exists and the engine's only cost is one ``is None`` test per event.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd

STEP_COLUMNS = ["instance", "step", "start_s", "duration_s", "prefill_tokens", "decode_tokens", "batch_size",
                "paused", "kv_tokens_read", "power_w", "energy_j"]


class StepLog:
    """Collects the steps of every engine of one simulated cluster (``steps.parquet``).

    ``record(engine)`` is called by ``Engine._step_end`` before the run's tokens are applied (the
    requests' ``computed`` still hold the contexts at the run's start); ``frame(names)`` builds the table.
    """

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        # per run: (instance index, perf model, start s, steps k, first step's duration s and energy J,
        #           prefill tokens, prefill prefix tokens, prefill chunks, decode seqs, decode context, paused)
        self._runs: list[tuple] = []

    def record(self, eng) -> None:
        """Record the step run ``eng`` (a ``harness.sim.engine.Engine``) is ending now."""
        p_tok = p_ctx = 0
        for req, n in eng._run_prefill:
            p_tok += n
            p_ctx += req.computed
        d_ctx = 0
        decode = eng._run_decode
        for req in decode:
            d_ctx += req.computed
        exact = eng._run_exact      # a single step's energy is the run's (read only for k == 1 runs)
        self._runs.append((eng.index, eng.perf, eng._run_start, len(eng._run_ends),
                           eng._run_durs[0] if exact else eng._run_ends[0],
                           eng._run_energy[0] if exact else eng._run_ej, p_tok, p_ctx, len(eng._run_prefill),
                           len(decode), d_ctx, eng._run_paused))

    def __len__(self) -> int:
        """Runs recorded (events, not steps)."""
        return len(self._runs)

    def frame(self, names: Sequence[str]) -> pd.DataFrame:
        """The steps of every instance (``STEP_COLUMNS``), sorted by instance then step.

        ``names``: instance names by index. Raises ``IndexError`` if an index has no name."""
        cols: dict[int, list[list]] = {}
        for (i, perf, start, k, dur0, e0, p_tok, p_ctx, n_pre, b, d_ctx, paused) in self._runs:
            st, du, pt, dt, bsz, pa, kv, en = cols.setdefault(i, [[] for _ in range(8)])
            if k == 1:   # a prefill/mixed step, or a single decode step: the engine's own cost
                st.append(start)
                du.append(dur0)
                en.append(e0)
                pt.append(p_tok)
                dt.append(b)
                bsz.append(n_pre + b)
                pa.append(paused)
                kv.append(p_ctx + d_ctx)
                continue
            t = start
            for j in range(k):   # a coalesced decode run: each step as step-by-step simulation costs it
                ctx = d_ctx + j * b
                ends, energy = perf.decode_run(b, ctx, 1, math.inf)
                st.append(t)
                du.append(ends[0])
                en.append(energy[0])
                kv.append(ctx)
                t = t + ends[0]
            pt.extend([0] * k)
            dt.extend([b] * k)
            bsz.extend([b] * k)
            pa.extend([paused] * k)
        frames = []
        for i in sorted(cols):
            st, du, pt, dt, bsz, pa, kv, en = cols[i]
            dur = np.asarray(du, dtype=float)
            ej = np.asarray(en, dtype=float)
            with np.errstate(divide="ignore", invalid="ignore"):
                pw = np.where(dur > 0, ej / dur, np.nan)
            frames.append(pd.DataFrame({
                "instance": names[i], "step": np.arange(len(st), dtype=np.int64),
                "start_s": np.asarray(st, dtype=float), "duration_s": dur,
                "prefill_tokens": np.asarray(pt, dtype=np.int64), "decode_tokens": np.asarray(dt, dtype=np.int64),
                "batch_size": np.asarray(bsz, dtype=np.int64), "paused": np.asarray(pa, dtype=np.int64),
                "kv_tokens_read": np.asarray(kv, dtype=np.int64), "power_w": pw, "energy_j": ej}))
        if not frames:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(STEP_COLUMNS, (
                object, np.int64, float, float, np.int64, np.int64, np.int64, np.int64, np.int64, float, float))})
        return pd.concat(frames, ignore_index=True)[STEP_COLUMNS]
