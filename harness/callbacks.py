"""Hydra callbacks: after a multirun, print and save one comparison table of every job's summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


def _overrides(run_dir: Path) -> dict[str, str]:
    """A job's command-line overrides (``.hydra/overrides.yaml``) as ``{key: value}``."""
    f = run_dir / ".hydra" / "overrides.yaml"
    if not f.exists():
        return {}
    out = {}
    for item in yaml.safe_load(f.read_text()) or []:
        k, _, v = str(item).partition("=")
        out[k.lstrip("+~")] = v
    return out


class SummaryTableCallback(Callback):
    """Writes ``comparison.md`` in the sweep directory and prints it: one column per job, labelled by
    the overrides that differ between the jobs (the scheduler by its name)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.catalog import summary_table
        sweep = Path(config.hydra.sweep.dir)
        summaries = {}

        def job(p: Path) -> str:  # the job's own directory (an override holding '/' nests deeper)
            return p.relative_to(sweep).parts[0]

        def num(p: Path) -> int:
            head = job(p).split("_")[0]
            return int(head) if head.isdigit() else 0

        runs = sorted(sweep.rglob("summary.json"), key=num)
        overrides = [_overrides(p.parent) for p in runs]
        varying = [k for k in dict.fromkeys(k for o in overrides for k in o)
                   if len({o.get(k) for o in overrides}) > 1]
        for p, o in zip(runs, overrides):
            label = ",".join(o[k] if k == "scheduler" else f"{k}={o.get(k)}" for k in varying) or job(p)
            summaries[f"{num(p)}:{label}" if label in summaries else label] = json.loads(p.read_text())
        if not summaries:
            return
        table = summary_table(summaries)
        (sweep / "comparison.md").write_text(table + "\n")
        if len(summaries) <= 12:
            print(f"\nSweep {sweep} ({len(summaries)} runs):\n{table}")
        else:
            print(f"\nSweep {sweep}: {len(summaries)} runs; table in {sweep / 'comparison.md'}; "
                  f"figures: python -m harness.report {sweep}")
