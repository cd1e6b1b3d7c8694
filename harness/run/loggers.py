"""Run loggers: where a run's results go besides its run directory (which is always written).

``logger=parquet``: nowhere else. ``logger=wandb``: a Weights & Biases run that gets the resolved config,
the summary metrics, the per-turn / per-conversation / per-instance tables (``wandb.Table``), the
instances' time series (history, against ``sim_time_s``) and two figures (TTFET CDF, KV occupancy).
The default mode is ``offline``: no network and no account; the run is written under
``<dir>/wandb/offline-run-*`` and can be uploaded later with ``wandb sync``.

Use :func:`logged_run` around the run (``run.py`` does)::

    with logged_run(cfg.logger, out_dir, config_dict):
        execute(run, out_dir, ...)

It starts the W&B run before the simulation and, in a ``finally``, logs what the run directory holds
and closes the W&B run -- with exit code 1 and the error in its summary when the run failed -- so a
failed simulation never leaves a W&B run open. If wandb is not installed, or ``wandb.init`` fails, a
warning is logged and the run goes on with parquet only; a failure while logging results is logged and
never replaces the run's own outcome.

Secrets: every mapping logged (config, summary) goes through :func:`scrub`, and every other string
logged (tags, group, run name) through :func:`scrub_string`. They redact by *value*: the value of any
environment variable named like a credential, a URL's password, the value after a credential's name
(``X-Api-Key: ...``, ``Authorization: ...``, ``token=...``), well-known key shapes (``sk-``, ``hf_``, JWTs,
``Bearer ...``); and under a key that names a credential (:func:`is_secret_key`: ``api_key``, ``token``,
``secret``, ``password``, ... -- not token *counts* such as ``max_num_batched_tokens``) any value but a
number, so a metric such as ``first_token_s`` keeps its value and its name. W&B's own metadata (command
line, git remote, code) is turned off, so an API key on the command line or in a git URL is not captured
either. Offline, W&B's update check and error reporting (Sentry) are off too: nothing waits on a network.
The same rule redacts the run's own files (:func:`scrub_yaml` for ``config.yaml`` and Hydra's ``.hydra/``
files, :class:`ScrubFilter` for ``run.log``, :func:`scrub` for ``meta.json`` and ``summary.json``; the
credentials a run was given, :func:`secret_values`, registered by :func:`remember_secrets`, are redacted
wherever they occur); docs/outputs.md, "Secrets, partial runs and the cache".
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol

log = logging.getLogger(__name__)

# the redaction rule lives in harness.core.redact (the analysis wing uses it too); its names are re-exported
from harness.core.redact import (REDACTED, ScrubFilter, is_secret_key, remember_secrets, scrub,  # noqa: F401
                                 scrub_string, scrub_yaml, secret_values)


class RunLogger(Protocol):
    """What :func:`logged_run` needs from a logger."""

    def finish(self, out_dir: Path, error: Optional[BaseException]) -> None:
        """Log what ``out_dir`` holds and close; ``error`` is the run's exception (``None``: success)."""


class NullLogger:
    """``logger=parquet``: the run directory is the whole record."""

    def finish(self, out_dir: Path, error: Optional[BaseException]) -> None:
        return None


def _sweep_group() -> Optional[str]:
    """The sweep directory's name when running inside a Hydra multirun, else ``None``."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode
        if not HydraConfig.initialized():
            return None
        hc = HydraConfig.get()
        return Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
    except Exception:
        return None


def _settings(wandb, offline: bool = False):
    """W&B settings that keep it quiet and out of anything that may carry a secret (command line,
    git remote URL, code), and offline away from the network (no update check, no error reports); keys a
    given wandb version lacks are skipped."""
    wanted = {"disable_git": True, "save_code": False, "disable_code": True, "silent": True,
              "console": "off", "x_disable_meta": True, "x_disable_stats": True,
              "_disable_meta": True, "_disable_stats": True}
    if offline:
        wanted.update({"mode": "offline", "x_disable_update_check": True, "x_disable_machine_info": True})
    kwargs = {}
    for k, v in wanted.items():
        try:
            wandb.Settings(**kwargs, **{k: v})
            kwargs[k] = v
        except Exception:
            continue
    return wandb.Settings(**kwargs)


class WandbLogger:
    """One W&B run per harness run (see the module docstring)."""

    def __init__(self, lc: Any, out_dir: Path, config: dict):
        import wandb
        self.wandb, self.lc = wandb, lc
        # read $WANDB_DIR here: wandb reads its environment once per process
        directory = lc.dir or os.environ.get("WANDB_DIR") or str(out_dir)
        Path(directory).mkdir(parents=True, exist_ok=True)
        names = [config.get(g, {}).get("name") for g in ("scheduler", "cluster", "workload")
                 if isinstance(config.get(g), dict)]
        backend = (config.get("backend") or {}).get("name", "sim") if isinstance(config.get("backend"), dict) else "sim"
        if lc.mode == "offline":  # offline never touches the network (no version check, no login, no Sentry)
            os.environ["WANDB_MODE"] = "offline"
            os.environ.setdefault("WANDB_DISABLE_SERVICE_CHECK", "true")
            os.environ["WANDB_ERROR_REPORTING"] = "false"   # wandb's Sentry reports: retried HTTP to sentry.io
            os.environ.setdefault("WANDB_DISABLE_CODE", "true")
        tags = [scrub_string(str(t)) for t in dict.fromkeys([*lc.tags, *[n for n in names if n]])]
        group = lc.group or _sweep_group()
        self.run = wandb.init(project=lc.project, entity=lc.entity, mode=lc.mode, dir=directory,
                              name=scrub_string(out_dir.name), group=scrub_string(group) if group else None,
                              job_type=scrub_string(str(backend)), tags=tags,
                              config=scrub(config), settings=_settings(wandb, offline=lc.mode == "offline"))

    def finish(self, out_dir: Path, error: Optional[BaseException]) -> None:
        try:
            self._log_results(Path(out_dir), error)
        except Exception as e:  # the parquet files are the record; never fail the run for W&B
            log.warning("wandb: logging the results failed: %s: %s", type(e).__name__, e)
        finally:
            self.run.finish(exit_code=1 if error is not None else 0)

    def _log_results(self, out_dir: Path, error: Optional[BaseException]) -> None:
        import pandas as pd
        wandb, lc, run = self.wandb, self.lc, self.run
        summary_path = out_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        if error is not None:
            summary.setdefault("partial", True)
            summary["error"] = summary.get("error") or f"{type(error).__name__}: {error}"
        for k, v in scrub(summary).items():
            if isinstance(v, float) and not math.isfinite(v):
                v = None  # JSON has no NaN; a missing value stays missing
            run.summary[k] = v
        if lc.log_tables:
            for name in ("conversations", "turns"):
                p = out_dir / f"{name}.parquet"
                if p.is_file():
                    df = pd.read_parquet(p)
                    run.log({name: wandb.Table(dataframe=df.head(lc.max_table_rows))})
        p = out_dir / "instances.parquet"
        if p.is_file():
            inst = pd.read_parquet(p)
            if len(inst):
                if lc.log_tables:
                    run.log({"instances": wandb.Table(dataframe=inst.head(lc.max_table_rows))})
                self._log_series(inst)
        if lc.log_figures and summary_path.is_file():
            self._log_figures(out_dir)

    def _log_series(self, inst) -> None:
        """Instance time series into the history, at most ``max_history_points`` points per instance."""
        run = self.run
        run.define_metric("sim_time_s")
        run.define_metric("instance/*", step_metric="sim_time_s")
        cols = [c for c in ("kv_used_frac", "kv_used_tokens", "num_running", "num_waiting", "energy_j")
                if c in inst.columns]
        wide = inst.pivot_table(index="t_s", columns="instance", values=cols, aggfunc="last").sort_index()
        step = max(1, math.ceil(len(wide) / self.lc.max_history_points))
        for t, row in wide.iloc[::step].iterrows():
            rec = {"sim_time_s": float(t)}
            for (col, name), v in row.items():
                if v == v:  # not NaN
                    rec[f"instance/{name}/{col}"] = float(v)
            run.log(rec)

    def _log_figures(self, out_dir: Path) -> None:
        """The run's figures (TTFET CDF, KV occupancy) rendered as PNG only (a logger shows images; no PDF, whose
        font subsetting is the slow part) and logged as images."""
        from harness.analysis import report
        from harness.analysis.plotting import figure_formats
        with tempfile.TemporaryDirectory() as tmp, figure_formats(("png",)):
            sw = report.load_sweep(out_dir)
            images = {}
            for f in [*report.ttfet_cdf(sw, Path(tmp)), *report.kv_occupancy(sw, Path(tmp))]:
                images[f"figures/{f.stem}"] = self.wandb.Image(str(f))
            if images:
                self.run.log(images)


THIRD_PARTY_LOGGERS = ("fontTools", "matplotlib", "PIL")
"""Libraries whose INFO records a run does not print (fontTools alone wrote ~165 lines per figure set when PDFs were
rendered for the logger): :func:`quiet_third_party_loggers` sets them to WARNING."""


def quiet_third_party_loggers(names: tuple[str, ...] = THIRD_PARTY_LOGGERS) -> None:
    """Set each logger of ``names`` to WARNING when it would pass INFO (a level set lower by the user's own
    logging config, or unset, is raised to WARNING; one set higher is kept)."""
    for name in names:
        lg = logging.getLogger(name)
        if lg.getEffectiveLevel() < logging.WARNING:
            lg.setLevel(logging.WARNING)


def start_logger(lc: Any, out_dir: Path, config: Any) -> RunLogger:
    """The logger ``lc.name`` names, started; falls back to :class:`NullLogger` (with a warning) when
    wandb is missing or cannot start. Third-party libraries' INFO records are silenced first
    (:func:`quiet_third_party_loggers`). ``config``: the run's config as a plain dict (the one W&B records), or a
    function of no arguments that returns it, called only where a logger records it (``run.py`` passes
    ``OmegaConf.to_container(cfg, resolve=True)`` so: ~2-5 ms a job that no logger but W&B reads)."""
    quiet_third_party_loggers()
    if lc.name != "wandb" or lc.mode == "disabled":
        return NullLogger()
    if callable(config):
        config = config()
    try:
        import wandb  # noqa: F401
    except ImportError:
        log.warning("logger=wandb but wandb is not installed (pip install -e '.[wandb]'); parquet only")
        return NullLogger()
    try:
        return WandbLogger(lc, Path(out_dir), config)
    except Exception as e:
        log.warning("wandb.init failed (%s: %s); parquet only", type(e).__name__, e)
        return NullLogger()


@contextmanager
def logged_run(lc: Any, out_dir: Path, config: Any) -> Iterator[RunLogger]:
    """Start the configured logger, run the body, then log the run directory and close the logger --
    also when the body raises (the exception propagates unchanged). ``config``: as :func:`start_logger`'s."""
    logger = start_logger(lc, Path(out_dir), config)
    error: Optional[BaseException] = None
    try:
        yield logger
    except BaseException as e:
        error = e
        raise
    finally:
        logger.finish(Path(out_dir), error)


# ---- reading an offline run back (no network, no account) --------------------------------------------
