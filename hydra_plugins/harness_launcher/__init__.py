"""The harness's Hydra launcher plugin (``hydra/launcher=pool``, the default of ``conf/config.yaml``): a
multirun's jobs on worker processes that persist across jobs (``harness.run.executor``)."""
