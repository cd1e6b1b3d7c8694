"""The P/D path as vLLM's ExampleConnector runs it in the simulator (``cluster.link.model=example_connector``;
harness/sim/engine.py "KV connector"), worked by hand.

vLLM 0.32's ``example_connector.py``: the decoder loads ``align_to_block_size(len - 1)`` tokens with
``align_to_block_size(n) = (n - 1) // block * block``, i.e. ``(len - 2) // block * block``, and recomputes the rest
(the tail, 2 to block + 1 tokens) as a local prefill; the prefiller saves ``align_to_block_size(len)`` tokens. The
save runs inside the prefiller's step that completes the prompt, the load inside the decoder's step that admits the
request (which also computes the tail and samples the first token).
"""

from __future__ import annotations

import pandas as pd
import pytest

from harness.core.profiles import LinkConfig, example_connector_loaded_tokens, example_connector_saved_tokens
from harness.run.config import scheduler_config
from harness.run.session import session_input, simulate
from harness.workload.workload import WorkloadConfig, build_workload
from tests.conftest import compose_run, conversation

KVB = 2 * 2 * 2 * 64 * 2      # the tiny model: K and V x 2 layers x 2 KV heads x head_dim 64 x 2 bytes = 1,024 B/token
L = 2


@pytest.mark.parametrize("prompt, block, loaded, tail", [
    (2, 128, 0, 2), (3, 128, 0, 3), (128, 128, 0, 128), (129, 128, 0, 129), (130, 128, 128, 2),
    (131, 128, 128, 3), (256, 128, 128, 128), (257, 128, 128, 129), (258, 128, 256, 2), (1000, 128, 896, 104),
    (17, 16, 0, 17), (18, 16, 16, 2), (33, 16, 16, 17), (34, 16, 32, 2), (1, 16, 0, 1),
])
def test_tail_recompute_around_block_boundaries(prompt, block, loaded, tail):
    """``(len - 2) // block * block`` loaded, the rest recomputed: worked out per length."""
    assert example_connector_loaded_tokens(prompt, block) == loaded
    assert prompt - loaded == tail


def test_saved_tokens():
    """``(len - 1) // block * block``: a whole-block prompt keeps its last block back (vLLM caps a hit at len - 1)."""
    assert [example_connector_saved_tokens(n, 128) for n in (1, 128, 129, 256, 257, 1000)] == [0, 0, 128, 128, 256, 896]


def one_turn(prompt: int, link: dict) -> pd.Series:
    """One single-turn conversation of ``prompt`` new tokens and 4 output tokens on ``cpu_1p1d`` (ConServe places
    turn 0 on the prefiller), block 128, ``cluster.link`` overridden by ``link``; its ``turns.parquet`` row."""
    over = [f"cluster.link.{k}={v}" for k, v in link.items()]
    run = compose_run(["cluster=cpu_1p1d", "scheduler=conserve", "engine.block_size=128", "model=tiny", *over])
    convs, stats = build_workload([conversation("c0", [(0, prompt, 4, 0.0)])], WorkloadConfig(arrival="fixed"))
    res = simulate(session_input(run), convs, stats, "conserve", scheduler_config("conserve", {"name": "conserve"}))
    assert not res.error
    t = pd.DataFrame(res.turns).set_index("turn").loc[0]
    assert t.prefill_instance == "prefiller0" and t.decode_instance == "decoder0"
    return t


@pytest.mark.parametrize("prompt", [129, 130, 300, 1000])
def test_decoder_recomputes_the_tail_and_the_costs_sit_in_the_right_steps(prompt):
    """The decoder computes exactly the tail (the turn's computed prefill = the prompt on the prefiller + the tail);
    the transfer is the loaded tokens. With costs (5 ms a save or load, 1 ms per layer, 1e8 B/s, 20 ms of front
    ends) against the same path at no cost: the prefiller's finish moves by the save alone (inside its step), the
    first token by save + front ends + load (the load inside the decoder's admitting step), each by hand."""
    free = {"model": "example_connector", "request_s": 0.0, "layer_s": 0.0, "frontend_s": 0.0,
            "bandwidth_bytes_per_s": 1e15}
    paid = {"model": "example_connector", "request_s": 0.005, "layer_s": 0.001, "frontend_s": 0.02,
            "bandwidth_bytes_per_s": 1e8}
    t0, t1 = one_turn(prompt, free), one_turn(prompt, paid)
    loaded = (prompt - 2) // 128 * 128
    saved = (prompt - 1) // 128 * 128
    for t in (t0, t1):
        assert t.prefill_computed_tokens == prompt + (prompt - loaded)
        assert t.transfer_tokens == loaded
    def cost(c: dict, tokens: int) -> float:      # one save or load (s): the LinkConfig docstring's formula
        return c["request_s"] + L * c["layer_s"] + tokens * KVB / c["bandwidth_bytes_per_s"]
    save = cost(paid, saved) - cost(free, saved)
    load = (cost(paid, loaded) - cost(free, loaded)) if loaded else 0.0     # nothing loaded: no load at all
    assert t1.prefill_done_s - t0.prefill_done_s == pytest.approx(save, abs=1e-9)
    assert (t1.first_token_s - t1.prefill_done_s) - (t0.first_token_s - t0.prefill_done_s) == \
        pytest.approx(paid["frontend_s"] + load, abs=1e-9)
    assert t1.transfer_s == pytest.approx(cost(paid, loaded) if loaded else 0.0, abs=1e-12)


def test_link_model_keeps_the_old_path():
    """``model=link`` (every shipped preset): the whole prompt moves on the link (latency + bytes / bandwidth), no
    tail is recomputed on the decoder; ``frontend_s`` delays the decoder's arrival."""
    t = one_turn(300, {"model": "link"})
    assert t.transfer_tokens == 300 and t.prefill_computed_tokens == 300
    assert t.transfer_s == pytest.approx(1e-4 + 300 * KVB / 1e9, rel=1e-9)     # cpu_1p1d's loopback link
    # the NixlConnector shape: + request_s + layers * (layer_s + blocks * descriptor_s) per transfer; 300 tokens
    # are 3 blocks of 128
    t3 = one_turn(300, {"model": "link", "request_s": 0.003, "layer_s": 2e-4, "descriptor_s": 1e-4})
    assert t3.transfer_s == pytest.approx(1e-4 + 300 * KVB / 1e9 + 0.003 + L * (2e-4 + 3 * 1e-4), rel=1e-9)
    # the front ends delay the decoder's arrival by frontend_s there too, and nothing else
    t2 = one_turn(300, {"model": "link", "frontend_s": 0.02})
    assert t2.prefill_done_s == t.prefill_done_s
    assert t2.first_token_s - t.first_token_s == pytest.approx(0.02, abs=1e-12)


def test_bad_link_model_names_the_field():
    with pytest.raises(ValueError, match="cluster.link.model"):
        LinkConfig(model="nixl").validate("cluster.link")


def test_a_later_turn_loads_the_whole_file_whatever_the_decoders_local_hit():
    """Fully disaggregated, a second turn goes through the prefiller again and arrives at the decoder that holds
    turn 0's blocks. vLLM's ExampleConnector reports the file beyond the local hit (``get_num_new_matched_tokens``)
    and, that being > 0, loads every aligned prompt token of the file (``build_connector_meta`` / ``start_load_kv``):
    the load is the whole file, not the part beyond the hit. Turn 0: 300 new tokens, 4 out; turn 1: 304 reused + 200
    new = 504 prompt tokens. The decoder's local hit is turn 0's whole blocks: 2 x 128 = 256 tokens (turn 0's 304
    tokens of KV); the file is (504 - 2) // 128 * 128 = 384 tokens > 256, so 384 are loaded (not 384 - 256 = 128),
    priced at 384 tokens, and the tail is 504 - 384 = 120."""
    paid = {"model": "example_connector", "request_s": 0.005, "layer_s": 0.001, "frontend_s": 0.0,
            "bandwidth_bytes_per_s": 1e8}
    over = [f"cluster.link.{k}={v}" for k, v in paid.items()]
    run = compose_run(["cluster=cpu_1p1d", "scheduler=disaggregated", "engine.block_size=128", "model=tiny", *over])
    convs, stats = build_workload([conversation("c0", [(0, 300, 4, 0.5), (304, 200, 4, 0.0)])],
                                  WorkloadConfig(arrival="fixed"))
    res = simulate(session_input(run), convs, stats, "disaggregated",
                   scheduler_config("disaggregated", {"name": "disaggregated"}))
    assert not res.error
    t = pd.DataFrame(res.turns).set_index("turn").loc[1]
    assert t.decode_instance == "decoder0" and t.decode_cached_tokens == 256
    assert t.transfer_tokens == 384
    assert t.transfer_s == pytest.approx(0.005 + L * 0.001 + 384 * KVB / 1e8, rel=1e-12)
