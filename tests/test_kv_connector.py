"""harness.vllm.kv_connector: which store entries of vLLM's ExampleConnector metadata are written. Hand-built
entries through ExampleConnector's own ``ReqMeta.make_meta`` (vLLM 0.32): a 300-token prompt, 128-token
blocks, aligned to ``(300 - 1) // 128 * 128 = 256`` tokens; one allocated block maps 128 slots, three map 256.

Skipped where vLLM is not installed."""

from __future__ import annotations

import pytest

from tests.conftest import skip_without_vllm

skip_without_vllm()   # vLLM (torch) is imported when a test runs, not at collection (tests/conftest.py)

PROMPT = list(range(300))


def entry(blocks: int, is_store: bool = True):
    """A store entry of ExampleConnector's metadata (``ReqMeta``) for ``blocks`` allocated blocks."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import ReqMeta
    return ReqMeta.make_meta(PROMPT, list(range(blocks)), 128, is_store, [])


def test_a_chunked_prompt_or_a_consumer_is_never_stored():
    from harness.vllm.kv_connector import storable
    whole, first_chunk = entry(3), entry(1)
    assert (whole.token_ids.shape[0], whole.slot_mapping.shape[0]) == (256, 256)
    assert (first_chunk.token_ids.shape[0], first_chunk.slot_mapping.shape[0]) == (256, 128)
    assert storable(whole, producer=True)
    assert not storable(first_chunk, producer=True)
    assert not storable(whole, producer=False)


@pytest.mark.parametrize("producer, kept, partial, consumer", [(True, 2, 1, 0), (False, 1, 0, 2)])
def test_the_step_metadata_keeps_loads_and_whole_stores(monkeypatch, producer, kept, partial, consumer):
    """ExampleConnector's metadata for a step with a load, a whole store and a chunked store: a producer keeps the
    load and the whole store, a consumer only the load; each drop is counted."""
    from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (ExampleConnector,
                                                                                ExampleConnectorMetadata)

    from harness.vllm.kv_connector import HarnessExampleConnector
    meta = ExampleConnectorMetadata()
    meta.requests = [entry(3, is_store=False), entry(3), entry(1)]
    monkeypatch.setattr(ExampleConnector, "build_connector_meta", lambda self, out: meta)
    conn = HarnessExampleConnector.__new__(HarnessExampleConnector)   # the filter only: no engine to build it on
    conn._producer, conn.dropped_partial, conn.dropped_consumer = producer, 0, 0
    out = conn.build_connector_meta(None)
    assert len(out.requests) == kept and not out.requests[0].is_store
    assert (conn.dropped_partial, conn.dropped_consumer) == (partial, consumer)
