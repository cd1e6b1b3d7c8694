"""The real-vLLM backend: a launcher for ``vllm serve`` instances, a streaming replay client, a
``/metrics`` scraper that feeds the same ``ClusterView`` the simulator produces, and NVML energy.

Reading order: ``config`` (the ``backend=vllm`` config and its validation; a leaf, imports nothing heavy),
``plugin`` (registers it with ``open``),
``flags`` (``engine.*`` knobs as ``vllm serve`` flags), ``launcher`` (processes), ``client`` (HTTP:
completions, P/D protocol), ``scrape`` (Prometheus text -> instance state; ``MetricsPoller``: every ``/metrics`` GET and parse of a
run in a thread of its own), ``otlp`` (per-request engine times from vLLM's OpenTelemetry spans), ``energy`` (NVML),
``backend`` (turns as requests, state from ``/metrics``), ``cluster`` (the ``Cluster`` a session drives:
launch or connect, warm up, drive the asyncio loop, tear down), ``tiny_model`` (an offline random-weight
model for CPU tests), ``crosscheck`` (client TTFT vs the server's histogram).
"""
