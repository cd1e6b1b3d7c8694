"""GPU energy from NVML (nvidia-ml-py): energy counters over exactly the measured window, and power.

``nvmlDeviceGetTotalEnergyConsumption`` (mJ since driver load, Volta and newer) is read at the window's
start and end; power (``nvmlDeviceGetPowerUsage``, mW) is sampled for the time series. Without NVIDIA
GPUs (or without ``pynvml``) every value is NaN and ``reason`` says why.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence


class EnergyMeter:
    """Energy of the GPUs named by index (``CUDA_VISIBLE_DEVICES`` values of the instances).

    Attributes: ``available`` (bool), ``reason`` (why not, '' if available).
    """

    def __init__(self, devices: Sequence[Optional[str]]):
        self.devices = list(devices)
        self.available = False
        self.reason = ""
        self._handles: list = []
        self._start_mj: list[float] = []
        try:
            import pynvml  # nvidia-ml-py
            pynvml.nvmlInit()
            self._nvml = pynvml
            for d in self.devices:
                if d is None:
                    raise RuntimeError("instance has no GPU device (CPU run)")
                self._handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(d.split(",")[0])))
            self.available = bool(self._handles)
            if not self.available:
                self.reason = "no GPU devices configured"
        except Exception as e:  # ImportError, NVMLError (no driver / no GPU), CPU instances
            self.reason = f"energy not measured: {type(e).__name__}: {e}"

    def start(self) -> None:
        """Read the energy counters at the start of the measured window."""
        if self.available:
            self._start_mj = [float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles]

    def energy_j(self) -> list[float]:
        """Energy per device since ``start()``, J (NaN when unavailable)."""
        if not self.available or not self._start_mj:
            return [math.nan] * len(self.devices)
        now = [float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self._handles]
        return [(b - a) / 1000.0 for a, b in zip(self._start_mj, now)]

    def power_w(self) -> list[float]:
        """Current power per device, W (NaN when unavailable)."""
        if not self.available:
            return [math.nan] * len(self.devices)
        return [self._nvml.nvmlDeviceGetPowerUsage(h) / 1000.0 for h in self._handles]
