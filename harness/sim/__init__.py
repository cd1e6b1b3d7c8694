"""The simulated backend: a discrete-event model of a cluster of vLLM-like engines.

Reading order: ``step_model`` (the step-model interface the engine calls), ``perf`` (the roofline and
Vidur-profile step models: step time and power), ``engine`` (one vLLM-like engine:
continuous batching, chunked prefill, paged KV with prefix caching, preemption by recompute),
``backend`` (a cluster of engines, KV transfers over links, the event loop that drives them: a
``harness.core.backend.Cluster``), ``plugin`` (the ``backend=sim`` config and ``open``).
"""
