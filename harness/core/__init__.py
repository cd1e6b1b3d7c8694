"""The core: the interfaces and records every other wing shares, and nothing else (it imports only itself).

* ``policy`` -- the policy interface (frozen views, decisions, ``Predictor``, ``PolicyContext``, the
  ``register`` decorator with the variants' traits, ``PolicyBase`` with the default hooks, placement helpers);
  ``schedulers`` -- the scheduler registry, filled (importing it loads ``baselines`` and the entry points);
  ``registry`` -- the registries of named plug-ins (schedulers, backends, engine batch rules by name).
* ``backend`` -- the ``Cluster`` protocol every backend implements, ``BackendConfig`` (its hooks) and the
  backend registry; ``batching`` -- the engine batch-rule interface (``BatchRule.plan``) and vLLM's own rules.
* ``controller`` -- the closed-loop state machine of conversations and turns (one for every backend);
  ``clock`` -- the simulator's event heap and the asyncio clock.
* ``recorder`` -- every output row and its schema, atomic file writes; ``trace`` -- the conversation record
  and the trace file format (loader, validator, writer).
* ``profiles`` -- hardware, model, link and engine profiles (Hydra schemas); ``paths`` -- where the
  project's files are (a leaf: no project import) and the code digest.
"""
