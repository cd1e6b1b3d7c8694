"""Roofline step-time and power model of one engine step.

Step time (DESIGN.md; the roofline form used by BLIS, the llm-d simulator)::

    compute_s = prefill_flops / (peak_flops * prefill_efficiency)
              + decode_flops  / (peak_flops * decode_efficiency)
    memory_s  = (weight_bytes + kv_read_bytes + kv_write_bytes) / (mem_bandwidth * memory_efficiency)
    step_s    = max(compute_s, memory_s) + step_overhead_s

FLOPs per step (dense decoder, 2 FLOPs per multiply-add; Kaplan et al. 2020, "Scaling Laws", Sec. 2.1):
  * matmuls: ``2 * num_layers * linear_params_per_layer`` per token processed;
  * LM head: ``2 * hidden_size * vocab_size`` per sequence that samples a token this step;
  * attention: ``4 * num_layers * num_heads * head_dim`` per (query token, key token) pair
    (QK^T and PV); a decode token with context c has c pairs; a prefill chunk of n tokens after a
    prefix of p tokens has ``n*p + n*(n+1)/2`` pairs (causal).
Bytes per step: all weights once; the KV of every context token attended to (read) and of every new
token (written), ``kv_bytes_per_token`` each. Activation traffic is ignored.

Power (energy per step, J)::

    E = idle_w * step_s + (tdp_w - idle_w) * min(step_s, compute_s + memory_power_frac * memory_s)

i.e. a fully compute-bound step draws the TDP (never more) and a memory-bound one ``memory_power_frac``
of the dynamic range (Splitwise, Patel et al., ISCA 2024, Sec. 3: token generation draws well below TDP and
is insensitive to power caps, prompt computation is power-hungry). If the step's mean power exceeds the
cap, the clock is lowered to a fraction f = ((cap - idle) / (demand - idle)) ** (1 / dvfs_exponent)
(dynamic power ~ f^3 under DVFS), compute_s is divided by f, and the power is the cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.profiles import HardwareConfig, ModelConfig


@dataclass(frozen=True, slots=True)
class StepCost:
    """Result of one step: ``time_s`` (s), ``energy_j`` (J), and the two roofline terms (s)."""

    time_s: float
    energy_j: float
    compute_s: float
    memory_s: float


class PerfModel:
    """Step time and energy of one engine (one hardware profile x one model).

    Precomputes per-token coefficients so one call costs a handful of float operations.
    """

    def __init__(self, hw: HardwareConfig, model: ModelConfig):
        self.hw = hw
        self.model = model
        self.kv_bytes_per_token = model.kv_bytes_per_token
        self._lin_flops_per_token = 2.0 * model.num_layers * model.linear_params_per_layer
        self._head_flops_per_seq = 2.0 * model.hidden_size * model.vocab_size
        self._attn_flops_per_pair = 4.0 * model.num_layers * model.num_heads * model.head_dim
        self._prefill_flops_rate = hw.peak_flops * hw.prefill_efficiency
        self._decode_flops_rate = hw.peak_flops * hw.decode_efficiency
        self._mem_rate = hw.mem_bandwidth_bytes_per_s * hw.memory_efficiency
        self._weights_s = model.weight_bytes / self._mem_rate
        self._kv_s_per_token = self.kv_bytes_per_token / self._mem_rate
        self._dyn_w = hw.tdp_w - hw.idle_w
        self._cap_dyn_w = hw.cap_w - hw.idle_w

    def step(self, prefill_tokens: int, prefill_pairs: float, prefill_ctx_tokens: int,
             prefill_seqs_sampling: int, decode_seqs: int, decode_ctx_tokens: int) -> StepCost:
        """Cost of one step.

        Args:
            prefill_tokens: prefill tokens computed this step (all chunks), tokens.
            prefill_pairs: attention (query, key) pairs of those chunks (see module docstring).
            prefill_ctx_tokens: prefix tokens read from the KV cache by the chunks, tokens.
            prefill_seqs_sampling: chunks that complete their prompt this step (sample a token).
            decode_seqs: decode sequences (one token each).
            decode_ctx_tokens: sum of their context lengths (KV tokens read), tokens.
        Returns:
            StepCost with time (s) and energy (J), throttled to the power cap.
        """
        pf = (self._lin_flops_per_token * prefill_tokens + self._attn_flops_per_pair * prefill_pairs
              + self._head_flops_per_seq * prefill_seqs_sampling)
        df = (self._lin_flops_per_token + self._head_flops_per_seq) * decode_seqs \
            + self._attn_flops_per_pair * decode_ctx_tokens
        compute_s = pf / self._prefill_flops_rate + df / self._decode_flops_rate
        memory_s = self._weights_s + self._kv_s_per_token * (
            prefill_ctx_tokens + prefill_tokens + decode_ctx_tokens + decode_seqs)
        return self._finish(compute_s, memory_s)

    def decode_step(self, decode_seqs: int, decode_ctx_tokens: int) -> StepCost:
        """Cost of a decode-only step (``step`` with no prefill), the simulator's hot path."""
        df = (self._lin_flops_per_token + self._head_flops_per_seq) * decode_seqs \
            + self._attn_flops_per_pair * decode_ctx_tokens
        compute_s = df / self._decode_flops_rate
        memory_s = self._weights_s + self._kv_s_per_token * (decode_ctx_tokens + decode_seqs)
        return self._finish(compute_s, memory_s)

    def decode_run(self, decode_seqs: int, ctx_tokens: int, max_steps: int, limit_s: float
                   ) -> tuple[list[float], list[float]]:
        """Cumulative end times (s) and energies (J) of up to ``max_steps`` consecutive decode-only steps
        of the same ``decode_seqs`` sequences, whose summed context starts at ``ctx_tokens`` and grows by
        ``decode_seqs`` per step; stops after the step that reaches ``limit_s``.

        Step ``j`` costs exactly ``decode_step(decode_seqs, ctx_tokens + j * decode_seqs)`` (the same
        arithmetic, inlined: this is the simulator's hot loop).
        """
        hw = self.hw
        b = decode_seqs
        base_f = (self._lin_flops_per_token + self._head_flops_per_seq) * b
        attn, rate_d = self._attn_flops_per_pair, self._decode_flops_rate
        w_s, kv_s, ovh = self._weights_s, self._kv_s_per_token, hw.step_overhead_s
        dyn_w, cap_dyn_w, mpf, idle = self._dyn_w, self._cap_dyn_w, hw.memory_power_frac, hw.idle_w
        ends: list[float] = []
        energy: list[float] = []
        t = e = 0.0
        ctx = ctx_tokens
        for _ in range(max_steps):
            compute_s = (base_f + attn * ctx) / rate_d
            memory_s = w_s + kv_s * (ctx + b)
            step_s = (compute_s if compute_s > memory_s else memory_s) + ovh
            busy = compute_s + mpf * memory_s
            dyn_j = dyn_w * (busy if busy < step_s else step_s)
            if dyn_j > cap_dyn_w * step_s:
                c = self._finish(compute_s, memory_s)
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

    def _finish(self, compute_s: float, memory_s: float) -> StepCost:
        hw = self.hw
        step_s = (compute_s if compute_s > memory_s else memory_s) + hw.step_overhead_s
        busy = compute_s + hw.memory_power_frac * memory_s
        dyn_j = self._dyn_w * (busy if busy < step_s else step_s)
        if dyn_j > self._cap_dyn_w * step_s:  # mean power above the cap: lower the clock
            demand_dyn_w = dyn_j / step_s
            f = (self._cap_dyn_w / demand_dyn_w) ** (1.0 / hw.dvfs_exponent)
            compute_s = compute_s / f
            step_s = max(compute_s, memory_s) + hw.step_overhead_s
            return StepCost(step_s, hw.cap_w * step_s, compute_s, memory_s)
        return StepCost(step_s, hw.idle_w * step_s + dyn_j, compute_s, memory_s)

    def prefill_tokens_per_s(self, chunk_tokens: int = 2048) -> float:
        """Steady prefill throughput estimate for a chunk of ``chunk_tokens`` with no prefix, tokens/s.

        What a router may know of an instance's hardware (used by admission and placement).
        """
        pairs = chunk_tokens * (chunk_tokens + 1) / 2
        c = self.step(chunk_tokens, pairs, 0, 1, 0, 0)
        return chunk_tokens / c.time_s

    def idle_decode_step_s(self) -> float:
        """One decode step of a single sequence with a 1024-token context, s: the "idle step time" a
        router may know of an instance's hardware (1024 tokens: a short chat context)."""
        return self.decode_step(1, 1024).time_s
