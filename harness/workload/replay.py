"""Arrivals pinned to a recorded run (``workload.arrivals_from_run=<run dir>``): every turn of the replay arrives
when the same turn arrived in that run, so a simulated replay of a real run compares like for like instead of
answering the real run's timeline with its own closed loop (a cheaper simulated engine empties faster,
starts the next turn earlier and so carries fewer decodes per step).

The recorded times are ``turns.parquet``'s ``submit_s`` (s on the run's clock, t = 0 at the run's start: when the
turn became ready at the client -- its conversation's arrival for turn 0, its previous turn's finish plus the
tool time for the others -- before admission; ``harness.core.recorder``). Turn 0's time becomes the
conversation's arrival (``harness.workload.workload.build_workload``); turn k >= 1 is made ready at its time by
the controller (``harness.core.controller.Controller``, ``pinned``) unless the replay's turn k - 1 finished later
than that: then it is ready at that finish (a turn cannot start before the output it extends), and it is counted
late (``summary.json``: ``pinned_turns_late``, ``pinned_late_max_s``). The concurrency gate of a closed
population (``workload.concurrency``) is off: the recorded times already carry it.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Mapping

KEY = "workload.arrivals_from_run"


@lru_cache(maxsize=8)
def _pins(path: str, mtime_ns: int) -> dict[tuple[str, int], float]:
    import pandas as pd
    t = pd.read_parquet(path, columns=["conversation_id", "turn", "submit_s"])
    out: dict[tuple[str, int], float] = {}
    for cid, turn, s in zip(t.conversation_id, t.turn, t.submit_s):
        s = float(s)
        if math.isfinite(s):
            out[(str(cid), int(turn))] = s
    return out


def pinned_turns(run_dir: str | Path) -> Mapping[tuple[str, int], float]:
    """``{(conversation_id, turn): arrival s}`` of every turn ``run_dir/turns.parquet`` recorded with a finite
    ``submit_s`` (s on that run's clock). Read once per file version.

    Raises:
        ValueError: ``run_dir`` has no ``turns.parquet`` (the message names :data:`KEY`), or it records no turn.
    """
    p = Path(run_dir) / "turns.parquet"
    if not p.is_file():
        raise ValueError(f"{KEY}={run_dir}: no turns.parquet there (a completed run directory is needed)")
    pins = _pins(str(p.resolve()), p.stat().st_mtime_ns)
    if not pins:
        raise ValueError(f"{KEY}={run_dir}: turns.parquet records no turn with an arrival time (submit_s)")
    return pins


def pin_conversations(conversations: list, run_dir: str | Path) -> list:
    """``[(arrival_s, record), ...]`` with each conversation's arrival set to its turn 0's recorded time, sorted
    by it (ties keep their order). A conversation the run never started (a partial run) has no time and is
    dropped.

    Raises:
        ValueError: no conversation of the workload has a recorded turn 0 (a different workload: the message
            names :data:`KEY` and a conversation id of each side).
    """
    pins = pinned_turns(run_dir)
    out = [(pins[(rec.conversation_id, 0)], rec) for _, rec in conversations if (rec.conversation_id, 0) in pins]
    if not out:
        theirs = next(iter(pins))[0]
        ours = conversations[0][1].conversation_id if conversations else "(none)"
        raise ValueError(f"{KEY}={run_dir}: none of the workload's conversations (e.g. {ours!r}) was recorded "
                         f"there (e.g. {theirs!r}): not the same workload")
    out.sort(key=lambda x: x[0])
    return out
