"""The ``sim`` backend plug-in: its config (the ``backend`` node when ``backend=sim``) and ``open``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Iterator, Optional, Sequence

from harness.core.backend import BackendConfig, SessionInput, register_backend

if TYPE_CHECKING:  # annotations only: the simulator's modules are imported by ``open``
    from harness.sim.backend import SimBackend


@dataclass
class SimBackendConfig(BackendConfig):
    """``backend=sim``: a simulated cluster of vLLM-like engines (``harness.sim``).

    max_coalesce_s: the longest run of identical decode-only steps simulated as one event, s; also the
        maximum staleness of the engine state a policy observes (like a scraped ``/metrics``). 0 = one
        event per step; the results are the same (tested).
    max_sim_time_s: a run whose virtual clock passes this stops, partial, naming this key, s (default
        one year: far beyond any trace; a tool time given as an epoch timestamp is caught here).
    max_events: a run that processes more events stops, partial, naming this key (the full shipped
        trace takes about 3e5).
    """

    supports_batch_rules: ClassVar[bool] = True  # the engines take a policy's batch rule (harness.core.batching)
    name: str = "sim"
    max_coalesce_s: float = 0.25
    max_sim_time_s: float = 3.156e7
    max_events: int = 200_000_000

    def validate(self, inp: "SessionInput") -> None:
        """Raise ``ValueError`` naming the key: ``backend.max_coalesce_s`` must be >= 0; the step model
        (``engine.step_model``) must price every instance's hardware x the model (``vidur_profile``: a Vidur
        profile must exist for each). (That the model fits every instance's hardware is checked for every backend by
        ``harness.run.config.resolve``.)"""
        if not self.max_coalesce_s >= 0:
            raise ValueError(f"backend.max_coalesce_s must be >= 0 (s), got {self.max_coalesce_s!r}")
        if not (isinstance(self.max_sim_time_s, (int, float)) and self.max_sim_time_s > 0):
            raise ValueError(f"backend.max_sim_time_s must be > 0 (s), got {self.max_sim_time_s!r}")
        if not (isinstance(self.max_events, int) and self.max_events > 0):
            raise ValueError(f"backend.max_events must be an int > 0, got {self.max_events!r}")
        from harness.sim.perf import make_step_model
        for hw in {id(hw): hw for _, _, hw in inp.instances}.values():   # e.g. vidur_profile: a profile for each
            make_step_model(hw, inp.model, inp.engine.step_model)


@register_backend("sim", SimBackendConfig)
@contextlib.contextmanager
def open_sim(inp: "SessionInput", cfg: SimBackendConfig, run_dir: Optional[Path] = None, *,
             conversations: Sequence = (), max_coalesce_s: Optional[float] = None,
             record_steps: Optional[bool] = None) -> Iterator["SimBackend"]:
    """A fresh simulated cluster of the session ``inp`` (its instances, model, engine, link) with the simulator
    settings ``cfg`` (s and event limits), on its own virtual clock, whose KV block pools know which blocks the
    workload's ``conversations`` (``(arrival_s, record)``) share (``harness.workload.prefix.BlockContent``: each
    conversation's own prefix, plus the workload's shared system prompt, ``inp.shared_prefix_tokens``).
    ``max_coalesce_s`` overrides ``cfg.max_coalesce_s`` (the unloaded-TTFET replays use ``inf``), s.
    ``record_steps``: record every engine step (``harness.sim.steps``); ``None``: when ``inp.log_steps``
    (``logger.steps``) and there is a run directory (the run itself, not the unloaded-TTFET replays). With a
    run directory the steps are written to ``<run_dir>/steps.parquet`` when the cluster closes, also after an
    error (what was simulated until then)."""
    from harness.workload.prefix import BlockContent
    from harness.sim.backend import SimBackend
    content = BlockContent([r for _, r in conversations], shared_prefix_tokens=inp.shared_prefix_tokens)
    if record_steps is None:
        record_steps = run_dir is not None and inp.log_steps
    cluster = SimBackend(list(inp.instances), inp.model, inp.engine, inp.link,
                         max_coalesce_s=cfg.max_coalesce_s if max_coalesce_s is None else max_coalesce_s,
                         max_sim_time_s=cfg.max_sim_time_s, max_events=cfg.max_events, content=content,
                         record_steps=record_steps)
    try:
        yield cluster
    finally:
        if record_steps and run_dir is not None:
            from harness.core.recorder import write_parquet
            write_parquet(cluster.steps_frame(), Path(run_dir) / "steps.parquet")
