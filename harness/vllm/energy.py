"""GPU energy from NVML (nvidia-ml-py), read on the node that holds the GPUs and identified by UUID.

``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer) is read at the measured
window's start and end; power (``nvmlDeviceGetPowerUsage``, mW) is sampled for the time series. An
instance's energy is the sum over all of its GPUs (tensor parallelism: ``tensor_parallel_size`` GPUs).

GPUs are named by UUID (``GPU-...``), never by a physical index: on a Slurm node the index a job sees in
``CUDA_VISIBLE_DEVICES`` is not the node's NVML index, and on a multi-node cluster an index says nothing
about which node. :func:`visible_gpu_uuids` turns the ``CUDA_VISIBLE_DEVICES`` a process was given (by
Slurm, by Ray, or by the local launcher) into UUIDs on that node: entries that are UUIDs are kept, integer
entries are NVML indices, which equal CUDA's indices when ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (NVML
enumerates in PCI bus order; every launcher sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` for its servers).

Each node runs its own :class:`NvmlCounters`; the harness gathers them through a per-instance reader (a
plain call for the local launcher, a Ray actor method, or the Slurm node agent's ``/energy``) into an
:class:`EnergyMeter`. Without NVIDIA GPUs (or without ``pynvml``) every value is NaN and ``reason`` says why.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence


def visible_gpu_uuids(visible: Optional[str]) -> list[str]:
    """UUIDs of the GPUs named by a ``CUDA_VISIBLE_DEVICES`` value, on this node.

    Raises:
        RuntimeError: no value (a CPU instance), no NVML, or an index NVML does not know.
    """
    if not visible:
        raise RuntimeError("instance has no GPU device (CPU run)")
    import pynvml  # nvidia-ml-py
    pynvml.nvmlInit()
    out = []
    for entry in (e.strip() for e in visible.split(",") if e.strip()):
        if entry.startswith(("GPU-", "MIG-")):
            out.append(entry)
        else:
            u = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(int(entry)))
            out.append(u.decode() if isinstance(u, bytes) else u)
    return out


class NvmlCounters:
    """NVML energy and power of a set of GPUs on this node, by UUID.

    ``read()`` returns ``{"uuids", "energy_mj", "power_mw"}`` with one value per GPU (mJ since driver load;
    mW now), or ``{"reason": ...}`` when NVML cannot read them (the reason is kept, nothing raised).
    """

    def __init__(self, uuids: Sequence[str]):
        self.uuids = list(uuids)
        self.reason = ""
        self._handles: list = []
        try:
            import pynvml
            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByUUID(u) for u in self.uuids]
            if not self._handles:
                self.reason = "no GPU devices configured"
        except Exception as e:  # ImportError, NVMLError (no driver / no GPU)
            self.reason = f"{type(e).__name__}: {e}"

    def read(self) -> dict:
        """Current counters of every GPU (see the class)."""
        if self.reason:
            return {"reason": self.reason}
        nv = self._nvml
        return {"uuids": self.uuids,
                "energy_mj": [float(nv.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles],
                "power_mw": [float(nv.nvmlDeviceGetPowerUsage(h)) for h in self._handles]}


def local_counters(visible: Optional[str]) -> NvmlCounters:
    """:class:`NvmlCounters` for a ``CUDA_VISIBLE_DEVICES`` value on this node (reason set when unusable)."""
    try:
        return NvmlCounters(visible_gpu_uuids(visible))
    except Exception as e:
        c = NvmlCounters.__new__(NvmlCounters)
        c.uuids, c._handles, c.reason = [], [], f"{type(e).__name__}: {e}"
        return c


class EnergyMeter:
    """Energy and power per instance, gathered from one reader per instance.

    Args:
        readers: per instance, a callable returning what :meth:`NvmlCounters.read` returns for that
            instance's GPUs (on whichever node they are).
    Attributes: ``available`` (all instances readable), ``reason`` (why not, '' if available),
    ``uuids`` (per instance, the GPU UUIDs measured).
    """

    def __init__(self, readers: Sequence[Callable[[], dict]]):
        self.readers = list(readers)
        self.uuids: list[list[str]] = []
        self._start_mj: list[float] = []
        self.reason = ""
        try:
            first = [r() for r in self.readers]
        except Exception as e:
            first = [{"reason": f"{type(e).__name__}: {e}"}]
        bad = [f.get("reason") for f in first if f.get("reason")]
        if not self.readers:
            bad = ["no instances"]
        if bad:
            self.reason = f"energy not measured: {bad[0]}"
        else:
            self.uuids = [list(f["uuids"]) for f in first]
        self.available = not self.reason

    def _read(self, key: str) -> list[float]:
        return [sum(r()[key]) for r in self.readers]

    def start(self) -> None:
        """Read the energy counters at the start of the measured window."""
        if self.available:
            self._start_mj = self._read("energy_mj")

    def energy_j(self) -> list[float]:
        """Energy per instance since ``start()`` (sum over its GPUs), J (NaN when unavailable)."""
        if not self.available or not self._start_mj:
            return [math.nan] * len(self.readers)
        return [(b - a) / 1000.0 for a, b in zip(self._start_mj, self._read("energy_mj"))]

    def power_w(self) -> list[float]:
        """Current power per instance (sum over its GPUs), W (NaN when unavailable)."""
        if not self.available:
            return [math.nan] * len(self.readers)
        return [p / 1000.0 for p in self._read("power_mw")]
