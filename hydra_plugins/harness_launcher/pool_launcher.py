"""``hydra/launcher=pool``: Hydra's launcher interface over the harness's sweep executor
(``harness.run.executor``): the jobs of a multirun on ``n_jobs`` worker processes (null: the cores this
process may use) that keep their imports, parsed traces and SLO baselines across jobs. ``pool_slurm`` /
``pool_ray`` (``conf/hydra/launcher/``): the same jobs in chunks, one Slurm task / Ray task per chunk, each one
process across its chunk's jobs (``harness.run.cluster_sweep``). Hydra finds them as a plugin (classes in the
``hydra_plugins`` namespace package); their configs are registered here, so the module stays light (Hydra imports
every plugin module at start-up; the cluster code is imported when a sweep launches)."""

from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher

# the schemas live in a module Hydra's plug-in scan does not execute again (see there: a config must name the same
# class objects as this process's modules, or it cannot be pickled)
from hydra_plugins.harness_launcher._conf import PoolLauncherConf, SlurmPoolLauncherConf

ConfigStore.instance().store(group="hydra/launcher", name="pool", node=PoolLauncherConf, provider="harness")
if SlurmPoolLauncherConf is not None:   # Hydra's submitit launcher installed ('.[slurm]'); else
    # conf/hydra/launcher/pool_slurm.yaml fails to compose, naming pool_slurm_schema
    ConfigStore.instance().store(group="hydra/launcher", name="pool_slurm_schema", node=SlurmPoolLauncherConf,
                                 provider="harness")


class PoolLauncher(Launcher):
    """Runs a sweep's jobs with ``harness.run.executor.launch`` (see there: workers, caches, interrupts)."""

    def __init__(self, n_jobs: Optional[int] = None, start_method: Optional[str] = None) -> None:
        self.n_jobs = n_jobs
        self.start_method = start_method
        self.config: Any = None
        self.task_function: Any = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from harness.run.executor import POOL_TARGET, install
        assert PoolLauncherConf._target_ == POOL_TARGET
        install(hydra_context)   # each job's config composed once (harness.run.executor.ComposedConfigs)
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from harness.run.executor import launch
        return launch(self.hydra_context, self.config, self.task_function, job_overrides, initial_job_idx,
                      self.n_jobs, self.start_method)


class SlurmPoolLauncher(Launcher):
    """``hydra/launcher=pool_slurm`` (``conf/hydra/launcher/pool_slurm.yaml``): the sweep's jobs in chunks of
    ``jobs_per_task``, one Slurm task per chunk (one job array, submitted with submitit), each task one process
    running its chunk's jobs one after another (``harness.run.cluster_sweep``). ``params``: the Slurm keys of
    Hydra's submitit launcher (``SlurmQueueConf``: ``partition``, ``timeout_min``, ``cpus_per_task``, ``mem_gb``,
    ``array_parallelism``, ``submitit_folder``, ...)."""

    def __init__(self, jobs_per_task: Optional[int] = None, **params: Any) -> None:
        from omegaconf import OmegaConf

        from harness.run.cluster_sweep import plan_chunks
        plan_chunks(1, jobs_per_task, 1)   # a bad jobs_per_task: ValueError naming it, before anything is submitted
        self.jobs_per_task = jobs_per_task
        self.params = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                       for k, v in params.items()}
        self.manifest: list = []
        self.config: Any = None
        self.task_function: Any = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from harness.run.executor import install
        install(hydra_context)   # each job's config composed once, in this process
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from harness.run.cluster_sweep import SlurmBackend, launch_chunks
        return launch_chunks(SlurmBackend(self.params), self.hydra_context, self.config, self.task_function,
                             job_overrides, initial_job_idx, self.jobs_per_task, self.manifest)


class RayPoolLauncher(Launcher):
    """``hydra/launcher=pool_ray`` (``conf/hydra/launcher/pool_ray.yaml``): the sweep's jobs in chunks of
    ``jobs_per_task``, one Ray task per chunk on the cluster ``ray.init(**ray.init)`` joins or starts, each task
    running its chunk's jobs one after another (``harness.run.cluster_sweep``); ``ray.remote``: the tasks'
    ``ray.remote`` options (``num_cpus``)."""

    def __init__(self, ray: Any = None, jobs_per_task: Optional[int] = None) -> None:
        from omegaconf import OmegaConf

        from harness.run.cluster_sweep import plan_chunks
        plan_chunks(1, jobs_per_task, 1)   # a bad jobs_per_task: ValueError naming it, before Ray starts
        ray = OmegaConf.to_container(ray, resolve=True) if OmegaConf.is_config(ray) else dict(ray or {})
        self.ray_init = dict(ray.get("init") or {})
        self.ray_remote = dict(ray.get("remote") or {})
        self.jobs_per_task = jobs_per_task
        self.manifest: list = []
        self.config: Any = None
        self.task_function: Any = None
        self.hydra_context: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from harness.run.executor import install
        install(hydra_context)
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[Any]:
        from harness.run.cluster_sweep import RayBackend, launch_chunks
        return launch_chunks(RayBackend(self.ray_init, self.ray_remote), self.hydra_context, self.config,
                             self.task_function, job_overrides, initial_job_idx, self.jobs_per_task, self.manifest)
