"""The agentic-serving harness. A reading guide.

Where a run starts: ``run.py`` (Hydra) -> ``harness.config.resolve`` (validate everything, naming the key)
-> ``harness.runner.execute`` (load the trace, build the workload, check the policies, open the backend,
run one session, write the files) -> ``harness.session.run_session``: the only place a controller, a
policy, a cluster and a recorder are put together, on every backend.

The pieces, from the inside out (dependencies point this way, never back):

* ``profiles`` -- hardware, model, link and engine profiles (Hydra schemas) and the KV-transfer formula.
* ``policy`` -- the policy interface: frozen views, decisions, the ``Predictor``, ``PolicyContext``, the
  registry decorator and the shared placement helpers. ``baselines/`` (the variants) import only this
  and ``fluid`` (WAIT's fluid model); ``schedulers`` imports ``baselines`` to fill the registry.
* ``trace`` / ``convert`` / ``workload`` -- the trace format, converters, and a workload (conversations,
  arrivals, statistics, the ``Oracle`` a predictor wraps).
* ``backend`` -- the ``Cluster`` protocol every backend implements, the ``TurnJob`` record, and the
  backend registry. Plug-ins: ``sim`` (``sim/plugin.py``; the simulator in ``sim/``) and ``vllm``
  (``vllm/plugin.py``; real servers in ``vllm/``). ``vllm`` never imports ``sim``.
* ``controller`` -- the closed-loop state machine of conversations and turns (one for every backend).
* ``recorder`` -- every output row and its schema, typed decision records, atomic file writes;
  ``metrics`` -- per-conversation tables, SLO, the summary; ``goodput`` -- per-request goodput (vLLM's and
  AIPerf's rules); ``catalog`` -- metric names, units, formats.
* ``session`` -- the wiring (above); ``runner`` -- a whole run; ``report`` / ``plots`` / ``callbacks`` /
  ``loggers`` -- sweeps, tables, figures (``plots``: any x/y, facets, filters, Pareto fronts), W&B;
  ``export`` -- a run in ``vllm bench serve`` / AIPerf result formats.
* ``calibrate`` -- fit a hardware profile's step-time coefficients to a real run (``logger.steps``);
  ``fidelity`` -- replay a real run's workload on the simulator and report per-metric errors.

Documents the code relies on are in ``docs/``: ``schedulers.md`` (the variants and their sources),
``metrics.md``, ``hardware.md``, ``vllm_cpu.md``, ``fidelity_cpu.md``.
"""


class LazyModule:
    """A module imported on its first attribute access: ``pd = LazyModule("pandas")`` at the top of a module
    keeps ``import harness.config`` (``run.py --help``, a config error) from paying for pandas/pyarrow
    (~0.6 s CPU, ~90 MiB RSS) until a table is actually built. ``name``: the module's dotted name."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        import importlib
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
