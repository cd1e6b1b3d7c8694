"""A real run's evidence kept small enough to ship: its step-time logs and its spans, gzip-compressed in place
(protocol runs a-r shipped their reports only, so nothing measured on them can be re-analysed).

What a run of ``backend=vllm`` with ``logger.steps=true`` writes and the fidelity tools read again:
``logs/<instance>.step_times.jsonl`` (every engine step, ``harness.vllm.wait_scheduler.StepTimingMixin``),
``logs/<instance>.steps.jsonl`` (a batch rule's step log) and ``server_metrics.json`` (vLLM's histograms and one
span per request). :func:`pack` replaces each by its ``.gz`` (the same bytes, gzip level 9; the plain file removed
only once the compressed one is written, read back and equal); the readers here take either form, so
``python -m harness.tools.fidelity steps``, ``calibrate --from-steps`` and ``fidelity`` read a packed run as they
read a fresh one. The shipped calibration (``docs/data/twin_cpu/calibration``: 1,680 logged steps) packs its
step log 317,661 -> 55,214 bytes and its ``server_metrics.json`` 225,520 -> 33,499 bytes.

``python -m harness.tools.fidelity protocol`` packs every real run it launched once it has read it; other runs
(twin sweeps, calibrations) with ``python -m harness.core.evidence RUN_DIR ...`` before they are shipped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

STEP_TIMES = ".step_times.jsonl"        # harness.vllm.cluster.step_times_env
RULE_STEPS = ".steps.jsonl"             # harness.vllm.cluster.batch_rule_env
SERVER_METRICS = "server_metrics.json"


def _either(path: Path) -> Optional[Path]:
    """``path`` if it is a file, else ``path.gz`` if that is, else None."""
    if path.is_file():
        return path
    gz = path.with_name(path.name + ".gz")
    return gz if gz.is_file() else None


def read_text(path: str | Path) -> str:
    """The text of ``path`` or, when only its gzip-compressed form exists, of ``path.gz`` (UTF-8).

    Raises:
        FileNotFoundError: neither exists (the message names both).
    """
    p = _either(Path(path))
    if p is None:
        raise FileNotFoundError(f"{path}: not found (nor {path}.gz)")
    if p.suffix == ".gz":
        with gzip.open(p, "rt", encoding="utf-8") as f:
            return f.read()
    return p.read_text()


def server_metrics(run_dir: str | Path) -> Optional[dict]:
    """``server_metrics.json`` of ``run_dir`` (plain or packed) as a dict; None when the run has none.

    Raises:
        ValueError: the file is not JSON (naming it).
    """
    p = _either(Path(run_dir) / SERVER_METRICS)
    if p is None:
        return None
    try:
        return json.loads(read_text(Path(run_dir) / SERVER_METRICS))
    except ValueError as e:
        raise ValueError(f"{p}: not JSON ({e})") from None


def step_time_logs(run_dir: str | Path) -> list[tuple[str, Path]]:
    """``[(instance, path)]`` of the step-time logs in ``run_dir/logs`` (``<instance>.step_times.jsonl``, or its
    ``.gz`` when only that exists), by instance name. Read each with :func:`read_text` of the plain name."""
    logs = Path(run_dir) / "logs"
    names = {f.name[: -len(STEP_TIMES)] for f in logs.glob("*" + STEP_TIMES)}
    names |= {f.name[: -len(STEP_TIMES) - 3] for f in logs.glob("*" + STEP_TIMES + ".gz")}
    return [(n, logs / (n + STEP_TIMES)) for n in sorted(names)]


def _gzip_in_place(p: Path) -> tuple[int, int]:
    """Replace ``p`` by ``p.gz`` (written to a temporary name, read back and compared, then renamed; ``p``
    removed last). Returns ``(bytes before, bytes after)``."""
    data = p.read_bytes()
    gz = p.with_name(p.name + ".gz")
    tmp = p.with_name(p.name + ".gz.tmp")
    with open(tmp, "wb") as f:
        f.write(gzip.compress(data, compresslevel=9, mtime=0))
        f.flush()
        os.fsync(f.fileno())
    if gzip.decompress(tmp.read_bytes()) != data:      # never lose what was measured
        tmp.unlink()
        raise OSError(f"{p}: its compressed copy does not read back equal; left uncompressed")
    os.replace(tmp, gz)
    p.unlink()
    return len(data), gz.stat().st_size


def pack(run_dir: str | Path) -> dict[str, tuple[int, int]]:
    """Compress ``run_dir``'s step-time logs, batch-rule step logs and ``server_metrics.json`` in place
    (module docstring); files already packed are left as they are. Returns ``{relative path: (bytes before,
    bytes after)}`` of the files compressed now.

    Raises:
        FileNotFoundError: ``run_dir`` is not a directory.
        OSError: a file could not be compressed (it is left as it was).
    """
    d = Path(run_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: not a run directory")
    todo = sorted((d / "logs").glob("*" + STEP_TIMES)) + sorted((d / "logs").glob("*" + RULE_STEPS))
    if (d / SERVER_METRICS).is_file():
        todo.append(d / SERVER_METRICS)
    return {str(p.relative_to(d)): _gzip_in_place(p) for p in todo}


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m harness.core.evidence RUN_DIR ...``: :func:`pack` each run directory; exit 2 when one is not a
    directory (nothing packed then), 1 when a file could not be compressed."""
    ap = argparse.ArgumentParser(prog="python -m harness.core.evidence",
                                 description="Compress a run's step-time logs and spans (server_metrics.json) in "
                                             "place, so it can be shipped; the fidelity tools read either form.")
    ap.add_argument("run_dirs", nargs="+", type=Path, help="run directories (backend=vllm, logger.steps=true)")
    a = ap.parse_args(argv)
    bad = [str(p) for p in a.run_dirs if not p.is_dir()]
    if bad:
        print(f"error: not a directory: {', '.join(bad)}", file=sys.stderr)
        return 2
    status = 0
    for p in a.run_dirs:
        try:
            for name, (n0, n1) in pack(p).items():
                print(f"{p / name}: {n0:,} -> {n1:,} bytes")
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
