"""Stand-alone commands on runs and traces (may import anything; nothing imports them).

* ``calibrate`` -- fit a hardware profile's step-time coefficients to a real run:
  ``python -m harness.tools.calibrate``.
* ``fidelity`` -- replay a real run's workload on the simulator, per-metric errors:
  ``python -m harness.tools.fidelity``.
* ``tracestats`` -- a trace's statistics before a run: ``python -m harness.tools.tracestats stats FILE``.
* ``reference`` -- the config and metric reference generated from the code: ``python -m harness.tools.reference``.
"""
