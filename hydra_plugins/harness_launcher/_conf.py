"""The structured configs (``hydra.launcher`` schemas) of the harness's launchers, in a module of their own that
Hydra's plug-in scan does not run again: ``Plugins._scan_all_plugins`` executes every module of the
``hydra_plugins`` namespace whose name does not start with ``_`` (hydra-core 1.3.8), again in the same module
object when it is imported already (``Singleton.set_state`` re-initialises the plug-ins: a spawned worker, a
Slurm / Ray task). A dataclass defined in ``pool_launcher.py`` itself was then a new class after each scan, and a
config composed before it named the old one: pickle refuses such a config ("not the same object as"), so every
copy of a job's config (``harness.run.executor.fresh_copy``, Hydra's ``run_job``) fell back to
``copy.deepcopy``, ~2x the CPU (docs/speed.md, "The sweep executor"). Defined here, the classes are created once
per process; ``pool_launcher`` registers them in Hydra's ConfigStore as before."""

from dataclasses import dataclass
from typing import Optional


@dataclass
class PoolLauncherConf:
    """``hydra.launcher`` of the pool launcher. ``n_jobs``: worker processes (null or <= 0: the cores this
    process may use; 1: the jobs run in the launching process, one after another); ``start_method``:
    ``fork`` | ``forkserver`` | ``spawn`` | null (``fork`` where the OS has it)."""
    _target_: str = "hydra_plugins.harness_launcher.pool_launcher.PoolLauncher"
    n_jobs: Optional[int] = None
    start_method: Optional[str] = None


try:   # the schema of pool_slurm: Hydra's submitit launcher's Slurm keys and jobs_per_task ('.[slurm]' installed)
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
except ImportError:   # conf/hydra/launcher/pool_slurm.yaml then fails to compose, naming pool_slurm_schema
    SlurmQueueConf = None

if SlurmQueueConf is not None:
    @dataclass
    class SlurmPoolLauncherConf(SlurmQueueConf):
        """``hydra.launcher`` of ``pool_slurm``: the keys of Hydra's submitit Slurm launcher (``SlurmQueueConf``)
        and ``jobs_per_task`` (jobs per Slurm task; null: ``ceil(jobs / array_parallelism)``)."""
        _target_: str = "hydra_plugins.harness_launcher.pool_launcher.SlurmPoolLauncher"
        jobs_per_task: Optional[int] = None
else:
    SlurmPoolLauncherConf = None
