"""The P/D KV connector of CPU pairs: vLLM's ``ExampleConnector`` (a shared directory), storing only what a
decoder can load.

vLLM 0.32's ``ExampleConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/example_connector.py``)
writes the KV of *every* new request it finds no file for, on either role, and names the file by the hash of
the request's block-aligned prompt while the slot mapping it saves covers only the blocks allocated so far.
Two consequences on a loaded pair (docs/vllm_cpu.md, "P/D between two CPU instances"):

* a prompt the scheduler chunks (its step's token budget already partly taken by other requests) is written
  with the KV of its first chunk under the whole prompt's name; the decoder that loads it fails with
  ``RuntimeError: shape mismatch: value tensor of shape [128, 2, 128] cannot be broadcast to indexing result
  of shape [384, 2, 128]`` and its engine dies (seen 2026-12-04 at 8 conversations/s on ``cpu_1p1d``);
* the decoder (``kv_consumer``) writes every local prefill to disk, work the measured engine should not do.

:class:`HarnessExampleConnector` keeps ExampleConnector's loading and file format and drops, from each step's
connector metadata, the store entries of a ``kv_consumer`` and every store entry whose slot mapping is shorter
than its tokens (a chunked prompt; counted and logged once per 100). The harness also starts the prefiller with
``--no-enable-chunked-prefill`` (``harness.vllm.cluster.instance_specs``) so that, with
``engine.max_num_batched_tokens`` >= ``--max-model-len``, no prompt of the prefiller is ever chunked and every
one is stored whole (vLLM's V1 scheduler then leaves a prompt that does not fit the step's remaining budget
waiting, ``vllm/v1/core/sched/scheduler.py``).
"""

from __future__ import annotations

import logging

from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ExampleConnector

log = logging.getLogger(__name__)


def storable(req, producer: bool) -> bool:
    """Whether the store entry ``req`` (``ReqMeta``: ``token_ids``, ``slot_mapping`` tensors) may be written:
    only on a producer, and only when its slot mapping covers every one of its tokens (same length)."""
    return producer and int(req.slot_mapping.shape[0]) == int(req.token_ids.shape[0])


class HarnessExampleConnector(ExampleConnector):
    """``ExampleConnector`` that stores only whole prompts, and only on a ``kv_producer`` (module docstring).

    Counters: ``dropped_partial`` (store entries of chunked prompts dropped), ``dropped_consumer`` (store
    entries of a consumer dropped)."""

    def __init__(self, vllm_config, role, *args, **kwargs):
        super().__init__(vllm_config, role, *args, **kwargs)
        ktc = vllm_config.kv_transfer_config
        self._producer = bool(ktc is not None and ktc.is_kv_producer)   # kv_producer or kv_both
        self.dropped_partial = 0
        self.dropped_consumer = 0

    def build_connector_meta(self, scheduler_output):
        """ExampleConnector's metadata for the step, less the store entries :func:`storable` refuses."""
        meta = super().build_connector_meta(scheduler_output)
        kept = []
        for r in meta.requests:
            if not r.is_store or storable(r, self._producer):
                kept.append(r)
            elif not self._producer:
                self.dropped_consumer += 1
            else:
                self.dropped_partial += 1
                if self.dropped_partial % 100 == 1:
                    log.warning("HarnessExampleConnector: not storing a chunked prompt (%d tokens, %d slots); "
                                "%d so far (the decoder recomputes it)", int(r.token_ids.shape[0]),
                                int(r.slot_mapping.shape[0]), self.dropped_partial)
        meta.requests = kept
        return meta
