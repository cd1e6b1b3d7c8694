"""The ``sim`` backend plug-in: its config (the ``backend`` node when ``backend=sim``) and ``open``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from harness.backend import register_backend


@dataclass
class SimBackendConfig:
    """``backend=sim``: a simulated cluster of vLLM-like engines (``harness.sim``).

    max_coalesce_s: the longest run of identical decode-only steps simulated as one event, s; also the
        maximum staleness of the engine state a policy observes (like a scraped ``/metrics``). 0 = one
        event per step; the results are the same (tested).
    """

    name: str = "sim"
    max_coalesce_s: float = 0.25

    def validate(self, run: Any) -> None:
        """Raise ``ValueError`` naming the key: ``backend.max_coalesce_s`` must be >= 0. (That the model
        fits every instance's hardware is checked for every backend by ``harness.config.resolve``.)"""
        if not self.max_coalesce_s >= 0:
            raise ValueError(f"backend.max_coalesce_s must be >= 0 (s), got {self.max_coalesce_s!r}")


@register_backend("sim", SimBackendConfig)
@contextlib.contextmanager
def open_sim(run: Any, run_dir: Path | None = None, *, max_coalesce_s: float | None = None) -> Iterator[Any]:
    """A fresh simulated cluster for ``run`` (a ``harness.config.Resolved``), on its own virtual clock.
    ``max_coalesce_s`` overrides the config's (the unloaded-TTFET replays use ``inf``). Nothing to tear
    down."""
    from harness.sim.backend import SimBackend
    cfg = run.cfg
    if max_coalesce_s is None:  # the run's own setting when it runs on the simulator, else the default
        max_coalesce_s = getattr(run.backend, "max_coalesce_s", SimBackendConfig.max_coalesce_s)
    yield SimBackend(run.instances, cfg.model, cfg.engine, cfg.cluster.link, max_coalesce_s=max_coalesce_s)
