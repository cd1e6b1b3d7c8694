"""A run: from the command line to the result files (may import every wing but ``harness.tools``).

* ``cli`` -- the command line (``python run.py``, the ``agentic-harness`` console script: Hydra);
  ``config`` -- the structured configs and start-up validation (``resolve``: every error names its key), and
  what a session reads of the resolved run (``session_input``: the ``harness.core.backend.SessionInput``).
* ``runner`` -- one run: load and check everything, the SLO baseline, open the backend, one session, the files.
* ``session`` -- the only place a controller, a policy, a cluster and a recorder are put together, on every
  backend (``SessionInput``, defined beside the backend interface in ``harness.core.backend``: what a session
  reads of the config, built once per run); ``slo_baseline`` --
  the relative SLO's denominator (each conversation's unloaded TTFET, replayed alone) and its caches.
* ``callbacks`` -- Hydra callbacks of a sweep (lock, validate every job first, the comparison table);
  ``loggers`` -- parquet and Weights & Biases.
"""
