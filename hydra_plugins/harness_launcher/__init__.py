"""The harness's Hydra launcher plugins: ``hydra/launcher=pool`` (the default of ``conf/config.yaml``): a
multirun's jobs on worker processes that persist across jobs (``harness.run.executor``); ``pool_slurm`` /
``pool_ray``: chunks of jobs, one Slurm task / Ray task per chunk, each one process across its jobs
(``harness.run.cluster_sweep``)."""
