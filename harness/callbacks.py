"""Hydra callbacks: after a multirun, print and save one comparison table of every job's summary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SummaryTableCallback(Callback):
    """Writes ``comparison.md`` in the sweep directory and prints it (one column per job)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.runner import summary_table
        sweep = Path(config.hydra.sweep.dir)
        summaries = {}

        def job(p: Path) -> str:  # the job's own directory (an override holding '/' nests deeper)
            return p.relative_to(sweep).parts[0]

        def num(p: Path) -> int:
            head = job(p).split("_")[0]
            return int(head) if head.isdigit() else 0

        for p in sorted(sweep.rglob("summary.json"), key=num):
            summaries[job(p)] = json.loads(p.read_text())
        if not summaries:
            return
        table = summary_table(summaries)
        (sweep / "comparison.md").write_text(table + "\n")
        print(f"\nSweep {sweep} ({len(summaries)} runs):\n{table}")
