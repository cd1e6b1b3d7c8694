"""Placing instances on nodes, and the ports and CPU cores each gets on its node (remote launchers).

``backend.placement``:

* ``pack``: fill one node before the next (``capacity`` instances per node, e.g. 8 GPUs / TP): a P/D
  pair on one 8-GPU node moves KV over NVLink/PCIe, not the network;
* ``spread``: round-robin over the nodes (a prefiller and a decoder on different nodes: KV over the
  network, what a multi-node P/D deployment measures).

Ports are allocated per machine address: the k-th instance placed on an address gets ``port_base + k``
(its NIXL side channel ``port_base + 500 + k``, a Slurm node agent ``port_base + 250 + k``), so two nodes
never need to agree on a port, and two "nodes" that share one machine (the tests' Ray nodes, every one on
127.0.0.1) do not collide. ``device=cpu``: the k-th instance on an address binds its OMP threads to core
``(cpu_bind_offset + k) mod cores``.
"""

from __future__ import annotations

import copy
from typing import Optional, Sequence

from harness.vllm.launcher import InstanceSpec

AGENT_PORT_OFFSET = 250
NIXL_PORT_OFFSET = 500


def assign(n: int, nodes: Sequence[str], capacity: Optional[int], placement: str) -> list[str]:
    """The node of each of ``n`` instances (in instance order).

    Args:
        nodes: node names, in order; capacity: instances per node (None: unlimited); placement:
            ``pack`` or ``spread``.
    Raises:
        ValueError: not enough room (``n > len(nodes) * capacity``) or an unknown placement.
    """
    if not nodes:
        raise ValueError("no nodes to place instances on")
    if capacity is not None and n > len(nodes) * capacity:
        raise ValueError(f"{n} instances do not fit on {len(nodes)} node(s) x {capacity} instance(s) per node "
                         f"(backend.gpus_per_node / backend.tensor_parallel_size)")
    if placement == "spread":
        return [nodes[i % len(nodes)] for i in range(n)]
    if placement == "pack":
        per = capacity if capacity is not None else n
        return [nodes[i // per] for i in range(n)]
    raise ValueError(f"backend.placement must be 'pack' or 'spread', got {placement!r}")


def localize(specs: Sequence[InstanceSpec], nodes: Sequence[str], addresses: Sequence[str], port_base: int,
             cpu_bind_offset: int, ncpu: int) -> list[InstanceSpec]:
    """Copies of ``specs`` with ``node``, ports and CPU binding set for where each runs.

    Args:
        nodes: each instance's node; addresses: each instance's machine address (ports are counted per
            address, see the module); ncpu: cores per machine (``device=cpu`` binding).
    """
    out, count = [], {}
    for s, node, addr in zip(specs, nodes, addresses):
        k = count.get(addr, 0)
        count[addr] = k + 1
        t = copy.deepcopy(s)
        t.node, t.port = node, port_base + k
        if "VLLM_NIXL_SIDE_CHANNEL_PORT" in t.env:
            t.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port_base + NIXL_PORT_OFFSET + k)
        if "VLLM_CPU_OMP_THREADS_BIND" in t.env:
            t.env["VLLM_CPU_OMP_THREADS_BIND"] = str((cpu_bind_offset + k) % max(1, ncpu))
        t.device = None  # a remote instance's GPUs are the ones Slurm or Ray gives it
        out.append(t)
    return out
