"""The step-model interface: what the simulated engine (``harness.sim.engine``), the step replay
(``harness.tools.steps``) and the router hints (``harness.run.config.instance_hints``) call on a step model.

A step model prices one engine step (time, s; energy, J). It subclasses :class:`StepModel`, implements
:meth:`StepModel.step`, and is registered by name with ``harness.core.registry.register_step_model`` (the
name is the value of ``engine.step_model``). Everything else has a default built on ``step``: a decode-only
step, runs of identical decode steps, the per-chunk step, the router hints, and the optional features that
price nothing unless a model declares them (the class attributes below). The built-in models are
``harness.sim.perf.PerfModel`` (``roofline``) and ``harness.sim.perf.VidurProfilePerfModel``
(``vidur_profile``); ``docs/extending.md`` ("A step model") has the recipe.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Sequence

if TYPE_CHECKING:
    from harness.core.profiles import HardwareConfig, ModelConfig

HINT_PREFILL_CHUNK_TOKENS = 2048
"""The prefill chunk of the prefill-throughput hint, tokens (vLLM's default step budget on GPUs under 70 GiB)."""
HINT_DECODE_CONTEXT_TOKENS = 1024
"""The context of the idle-decode-step hint's one sequence, tokens (a short chat context)."""
HINT_DECODE_LINE_TOKENS = (1024, 8192)
"""The two contexts (tokens) of one decode sequence whose step times give the default WAIT iteration line
(:meth:`StepModel.decode_linear_coefficients`): a short chat context and a long agentic one."""


@dataclass(frozen=True, slots=True)
class StepCost:
    """Result of one step: ``time_s`` (s), ``energy_j`` (J), and its FLOP time ``compute_s`` and byte
    time ``memory_s`` (s; ``harness.sim.perf``'s docstring defines them for the roofline)."""

    time_s: float
    energy_j: float
    compute_s: float
    memory_s: float


def chunk_sums(chunks: Sequence[tuple[int, int]]) -> tuple[int, float, int]:
    """The sums a step's prefill chunks ``[(tokens, KV prefix tokens)]`` enter a step model with: prefill tokens,
    causal attention pairs (a chunk of ``n`` tokens after ``p`` has ``n * p + n * (n + 1) / 2``) and prefix KV
    tokens: ``(tokens, pairs, prefix tokens)``."""
    pairs = 0.0
    p_tok = p_ctx = 0
    for c, prefix in chunks:
        p_tok += c
        p_ctx += prefix
        pairs += c * prefix + c * (c + 1) / 2
    return p_tok, pairs, p_ctx


class StepModel:
    """Base class of a step model: one hardware profile x one model.

    Attributes (class defaults; a model that prices a feature sets its own):
        hw, model: the ``HardwareConfig`` and ``ModelConfig`` it prices (``None`` in a stand-in model for tests:
            the engine then reads ``engine.async_scheduling`` alone and prices no idle power).
        kv_bytes_per_token: KV bytes per token, bytes (the engine's KV transfers read it).
        wants_batch: the engine passes each prefill chunk and decode context (:meth:`step_batch`) instead of
            the step's sums (:meth:`step`); ``False``: sums.
        has_decode_start: a request's first decode step is priced apart (``first_decodes`` of :meth:`step` and
            :meth:`decode_step`); the engine then runs such a step on its own, never inside a run of identical
            decode steps.
        between_step_s: the engine core's work between two steps included in every step's time, s (the
            step-time logs leave it out; ``harness.tools.steps.replay`` subtracts it).
        after_idle_s: the extra time of a step after an idle engine, per idle band, s (:meth:`after_idle`);
            empty: none.
    """

    hw: Optional["HardwareConfig"] = None
    model: Optional["ModelConfig"] = None
    kv_bytes_per_token: float = 0.0
    wants_batch: bool = False
    has_decode_start: bool = False
    between_step_s: float = 0.0
    after_idle_s: tuple[float, ...] = ()

    def step(self, prefill_tokens: int, prefill_pairs: float, prefill_ctx_tokens: int,
             prefill_seqs_sampling: int, decode_seqs: int, decode_ctx_tokens: int,
             prefill_seqs: int = 0, prefill_cached_tokens: int = 0, first_decodes: int = 0) -> StepCost:
        """Cost of one step (:class:`StepCost`: time s, energy J). The engine passes every argument.

        Args:
            prefill_tokens: prefill tokens computed this step (all chunks), tokens.
            prefill_pairs: attention (query, key) pairs of those chunks (``harness.sim.perf``'s docstring).
            prefill_ctx_tokens: prefix tokens read from the KV cache by the chunks, tokens.
            prefill_seqs_sampling: chunks that complete their prompt this step (sample a token).
            decode_seqs: decode sequences (one token each).
            decode_ctx_tokens: sum of their context lengths (KV tokens read), tokens.
            prefill_seqs: requests prefilling in the step (chunks).
            prefill_cached_tokens: cached prefix tokens reused by requests whose prefill the step starts, tokens.
            first_decodes: decode sequences in their request's first decode step.
        Raises:
            NotImplementedError: every step model implements it.
        """
        raise NotImplementedError(f"{type(self).__name__}.step: a step model prices a step")

    def step_batch(self, chunks: list[tuple[int, int]], decode_kv: list[int], samples: int,
                   prefill_cached_tokens: int = 0, first_decodes: int = 0) -> StepCost:
        """Cost of one step from its parts: prefill ``chunks`` ``[(tokens, KV prefix tokens)]``, decode contexts
        ``decode_kv`` (tokens), ``samples`` chunks that complete their prompt. Default: :meth:`step` of the sums
        (a chunk of ``n`` tokens after ``p`` has ``n * p + n * (n + 1) / 2`` causal pairs)."""
        p_tok, pairs, p_ctx = chunk_sums(chunks)
        return self.step(p_tok, pairs, p_ctx, samples, len(decode_kv), sum(decode_kv), len(chunks),
                         prefill_cached_tokens, first_decodes)

    def decode_step(self, decode_seqs: int, decode_ctx_tokens: int, first_decodes: int = 0) -> StepCost:
        """Cost of a decode-only step of ``decode_seqs`` sequences reading ``decode_ctx_tokens`` KV tokens, of which
        ``first_decodes`` are in their request's first decode step. Default: :meth:`step` with no prefill."""
        return self.step(0, 0.0, 0, 0, decode_seqs, decode_ctx_tokens, 0, 0, first_decodes)

    def decode_run(self, decode_seqs: int, ctx_tokens: int, max_steps: int, limit_s: float
                   ) -> tuple[list[float], list[float]]:
        """Cumulative end times (s) and energies (J) of up to ``max_steps`` consecutive decode-only steps of the
        same ``decode_seqs`` sequences (summed context ``ctx_tokens + j * decode_seqs`` at step j), stopping after
        the step that reaches ``limit_s``. Default: :meth:`decode_step` step by step."""
        ends: list[float] = []
        energy: list[float] = []
        t = e = 0.0
        ctx = ctx_tokens
        for _ in range(max_steps):
            c = self.decode_step(decode_seqs, ctx)
            t += c.time_s
            e += c.energy_j
            ends.append(t)
            energy.append(e)
            if t >= limit_s:
                break
            ctx += decode_seqs
        return ends, energy

    def decode_run_total(self, decode_seqs: int, ctx_tokens: int, max_steps: int, limit_s: float
                         ) -> tuple[list[float], float]:
        """:meth:`decode_run` with the run's total energy only: ``(cumulative end times s, energy J)``."""
        ends, energy = self.decode_run(decode_seqs, ctx_tokens, max_steps, limit_s)
        return ends, energy[-1]

    def decode_one(self, decode_seqs: int, ctx_tokens: int) -> tuple[float, float]:
        """One decode-only step of ``decode_seqs`` sequences at summed context ``ctx_tokens`` (tokens) as a run of
        one step: ``(time s, energy J)``, i.e. ``(ends[0], energy)`` of ``decode_run_total(decode_seqs, ctx_tokens,
        1, limit)`` bit for bit (any ``limit``: a run of one step ends after its step). The engine's timeout-paced
        runs price each step with it. Default: :meth:`decode_run_total`."""
        ends, energy = self.decode_run_total(decode_seqs, ctx_tokens, 1, math.inf)
        return ends[0], energy

    def decode_pricer(self, decode_seqs: int) -> Callable[[int], tuple[float, float]]:
        """:meth:`decode_one` of ``decode_seqs`` sequences as a function of the summed context (tokens -> ``(time
        s, energy J)``, the same values): the engine's timeout-paced runs take it once per batch size and call it
        once per step. Default: :meth:`decode_one` with the batch bound."""
        return functools.partial(self.decode_one, decode_seqs)

    def decode_affine(self, decode_seqs: int) -> Optional[tuple[float, float, float, float, float, float]]:
        """Where :meth:`decode_pricer` of ``decode_seqs`` sequences is the plain step (a time affine in the context),
        its terms ``(kv_s, base_s, busy0, dyn_w, idle_w, mpf)`` such that at summed context ``ctx`` (tokens)
        ``kv_m = kv_s * (ctx + decode_seqs)``, ``step = base_s + kv_m`` and the pricer returns ``(0.0 + step, 0.0 +
        (idle_w * step + dyn_w * (busy0 + mpf * kv_m)))`` bit for bit (s, J; the engine's timeout-paced runs then
        price a step inline, without a call). ``None``: no such terms (the default; the pricer is called)."""
        return None

    def decode_steps(self, decode_seqs: int, ctx_tokens: int, max_steps: int, start_s: float, limit_s: float
                     ) -> tuple[list[float], list[float], list[float]]:
        """Up to ``max_steps`` consecutive decode-only steps as one event per step would simulate them:
        ``(absolute end times s, durations s, energies J)``, one per step, from ``start_s``; stops after the
        step that ends at or after ``start_s + limit_s``. Default: :meth:`decode_step` step by step."""
        ends: list[float] = []
        durs: list[float] = []
        energy: list[float] = []
        t = start_s
        stop = start_s + limit_s
        ctx = ctx_tokens
        for _ in range(max_steps):
            c = self.decode_step(decode_seqs, ctx)
            t = t + c.time_s
            ends.append(t)
            durs.append(c.time_s)
            energy.append(c.energy_j)
            if t >= stop:
                break
            ctx += decode_seqs
        return ends, durs, energy

    def after_idle(self, idle_s: float) -> float:
        """The extra time of a step that begins ``idle_s`` s after the engine's previous step ended, s.
        Default: 0 (the engine skips the term when ``after_idle_s`` is empty)."""
        return 0.0

    def cpu_step_s(self) -> float:
        """The per-step CPU work that async scheduling overlaps with the step in flight, s. Default: the hardware
        profile's ``step_overhead_s`` (scheduling, input preparation, output processing; 0 without a profile)."""
        return float(getattr(self.hw, "step_overhead_s", 0.0) or 0.0)

    # ---- router hints (harness.run.config.instance_hints): the model's own prices ---------------------------
    def prefill_tokens_per_s(self, chunk_tokens: int = HINT_PREFILL_CHUNK_TOKENS) -> float:
        """Prefill throughput of one step holding one chunk of ``chunk_tokens`` with no prefix (it completes its
        prompt), tokens/s: ``chunk_tokens`` over that step's time."""
        c = self.step_batch([(chunk_tokens, 0)], [], 1)
        return chunk_tokens / c.time_s

    def idle_decode_step_s(self) -> float:
        """One decode step of one sequence with a ``HINT_DECODE_CONTEXT_TOKENS`` context, s (the idle step time
        a router may know of an instance)."""
        return self.decode_step(1, HINT_DECODE_CONTEXT_TOKENS).time_s

    def decode_linear_coefficients(self) -> tuple[float, float]:
        """``(d0_s, d1_s_per_token)`` of the WAIT fluid model's iteration line ``tau = d0 + d1 * KV tokens``
        (Ao et al., arXiv 2504.11320). Default: the secant of one sequence's decode-step time between the two
        contexts of ``HINT_DECODE_LINE_TOKENS`` (d1: its slope; d0: the line at 0 tokens)."""
        k0, k1 = HINT_DECODE_LINE_TOKENS
        t0, t1 = self.decode_step(1, k0).time_s, self.decode_step(1, k1).time_s
        d1 = (t1 - t0) / (k1 - k0)
        return t0 - d1 * k0, d1

    def prefill_token_s(self) -> float:
        """What one prompt token adds to an iteration when prefill is compute-bound, s/token (the WAIT fluid
        model's ``d2``). Default: the secant of a no-prefix prefill step's time between chunks of
        ``HINT_PREFILL_CHUNK_TOKENS / 2`` and ``HINT_PREFILL_CHUNK_TOKENS`` tokens."""
        n1 = HINT_PREFILL_CHUNK_TOKENS
        n0 = n1 // 2
        t0 = self.step_batch([(n0, 0)], [], 1).time_s
        t1 = self.step_batch([(n1, 0)], [], 1).time_s
        return (t1 - t0) / (n1 - n0)

