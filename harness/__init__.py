"""The agentic-serving harness. A reading guide.

Where a run starts: ``run.py`` (Hydra) -> ``harness.run.config.resolve`` (validate everything, naming the
key) -> ``harness.run.runner.execute`` (load the trace, build the workload, check the policies, open the
backend, run one session, write the files) -> ``harness.run.session.run_session``: the only place a
controller, a policy, a cluster and a recorder are put together, on every backend.

The wings (each imports only the wings above it in this list; ``tests/test_pipeline.py`` checks it):

* ``core/`` -- the interfaces and records: policy, backend, batch rules, controller, recorder, registry,
  clock, profiles, the trace format, paths.
* ``workload/`` -- what is replayed: sampling, arrivals, shared KV blocks, trace converters.
* ``sim/``, ``vllm/`` -- the backends (plug-ins of ``core.backend``): the simulated cluster and real vLLM
  servers. Neither imports the other, ``baselines`` or the run wing.
* ``analysis/`` -- metrics, SLOs, validity, goodput, catalog, intervals and verdicts, reports, exports,
  fingerprints and locks.
* ``run/`` -- config, runner, session (and the SLO baseline), CLI, sweep callbacks, loggers.
* ``tools/`` -- calibration, fidelity, trace statistics (stand-alone commands).

The scheduler variants are in ``baselines/`` (one module each; WAIT's fluid model, rules and variants in
``baselines/wait/``); they import only ``core.policy``, ``core.batching``, ``core.registry`` and
:class:`LazyModule` from here.
Documents the code relies on are in ``docs/``; how to add a scheduler, a batch rule, a backend or a metric:
``docs/extending.md``.
"""


class LazyModule:
    """A module imported on its first attribute access: ``pd = LazyModule("pandas")`` at the top of a module
    keeps ``import harness.run.config`` (``run.py --help``, a config error) from paying for pandas/pyarrow
    (~0.6 s CPU, ~90 MiB RSS) until a table is actually built; ``np = LazyModule("numpy", globals(), "np")`` the
    same for numpy (~0.2 s CPU), and on that first access it puts the module itself in its place
    (``namespace[key]``: the importing module's global), so every later ``np.`` of that module reads the module
    directly, at no cost per access (a hot loop's ``np.`` never passes through here again). ``name``: the module's
    dotted name; ``namespace``, ``key``: where the importing module holds this object (both or neither)."""

    __slots__ = ("_name", "_namespace", "_key")

    def __init__(self, name: str, namespace: dict = None, key: str = None):
        if (namespace is None) != (key is None):
            raise TypeError("LazyModule: give both namespace and key, or neither")
        self._name = name
        self._namespace = namespace
        self._key = key

    def __getattr__(self, attr: str):
        import importlib
        module = importlib.import_module(self._name)
        if self._namespace is not None and self._namespace.get(self._key) is self:
            self._namespace[self._key] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
