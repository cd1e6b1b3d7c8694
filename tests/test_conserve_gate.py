"""ConServe's admission gate on hand-built cluster views (baselines/conserve.py, docs/schedulers.md).

One prefiller (index 0) and two decoders (1, 2) of KV capacity 1,000,000 tokens each; the decoders hold
950,000 and 50,000 tokens. By hand: the pool's occupancy is (950,000 + 50,000) / 2,000,000 = 0.50, the
fullest decoder's 950,000 / 1,000,000 = 0.95. With ``kv_admit_frac`` 0.9 the paper's pool gate admits a
new conversation (0.50 < 0.9) and the ``max_decoder`` gate holds it (0.95 >= 0.9); a later turn of an
admitted conversation passes either gate (only new conversations are held).
"""

from __future__ import annotations

import pytest

from baselines.conserve import Conserve, ConserveConfig, make
from harness.core.policy import ClusterView
from tests.test_ampd import inst, turn


def cluster(used1: int, used2: int) -> ClusterView:
    return ClusterView(0.0, (inst(0, "prefiller"), inst(1, "decoder", kv_used=used1), inst(2, "decoder", kv_used=used2)),
                       100_000, 1e10, 0.0, 0)


NEW = turn(cid="new", k=0, prompt=10_000, reused=0, prev_decode=-1, prev_out=0, cached=())
LATER = turn(cid="old", k=3)


@pytest.mark.parametrize("gate, admitted", [("pool", (0, 1)), ("max_decoder", (1,))])
def test_the_gate_reads_the_pool_or_the_fullest_decoder(gate, admitted):
    pol = Conserve(ConserveConfig(kv_gate=gate))
    a = pol.admit((NEW, LATER), cluster(950_000, 50_000), 0.0)
    assert a.admit == admitted
    assert (a.recheck_at is None) == (len(admitted) == 2)   # a held conversation is re-polled
    assert a.reason.startswith("pool kv=0.500" if gate == "pool" else "max decoder kv=0.950")


def test_both_gates_admit_below_the_threshold_and_hold_above_it():
    for gate in ("pool", "max_decoder"):   # 0.85 on each decoder: pool 0.85, max 0.85, both < 0.9
        assert Conserve(ConserveConfig(kv_gate=gate)).admit((NEW,), cluster(850_000, 850_000), 0.0).admit == (0,)
        assert Conserve(ConserveConfig(kv_gate=gate)).admit((NEW,), cluster(950_000, 950_000), 0.0).admit == ()


def test_an_unknown_gate_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="scheduler.kv_gate"):
        make(ConserveConfig(kv_gate="decoder"), None)
