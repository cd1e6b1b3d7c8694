"""``hydra/launcher=pool``: Hydra's launcher interface over the harness's sweep executor
(``harness.run.executor``): the jobs of a multirun on ``n_jobs`` worker processes (null: the cores this
process may use) that keep their imports, parsed traces and SLO baselines across jobs. Hydra finds it as a
plugin (a class in the ``hydra_plugins`` namespace package); its config is registered here, so the module
stays light (Hydra imports every plugin module at start-up)."""

from dataclasses import dataclass
from typing import Any, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.plugins.launcher import Launcher


@dataclass
class PoolLauncherConf:
    """``hydra.launcher`` of the pool launcher. ``n_jobs``: worker processes (null or <= 0: the cores this
    process may use; 1: the jobs run in the launching process, one after another); ``start_method``:
    ``fork`` | ``forkserver`` | ``spawn`` | null (``fork`` where the OS has it)."""
    _target_: str = "hydra_plugins.harness_launcher.pool_launcher.PoolLauncher"
    n_jobs: Optional[int] = None
    start_method: Optional[str] = None


ConfigStore.instance().store(group="hydra/launcher", name="pool", node=PoolLauncherConf, provider="harness")


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
