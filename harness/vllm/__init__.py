"""The real-vLLM backend: a launcher for ``vllm serve`` instances, a streaming replay client, a
``/metrics`` scraper that feeds the same ``ClusterView`` the simulator produces, and NVML energy.

Reading order: ``launcher`` (processes), ``client`` (HTTP: completions, P/D protocol), ``scrape``
(Prometheus text -> instance state), ``energy`` (NVML), ``backend`` (the ``Backend`` the controller
drives), ``tiny_model`` (an offline random-weight model for CPU tests).
"""
