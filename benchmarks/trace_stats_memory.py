"""Peak memory of ``python -m harness.tools.tracestats stats`` on a large generated request trace.

    python benchmarks/trace_stats_memory.py [N_REQUESTS] [--keep PATH]

Writes an N-line (default 10^6) Mooncake-format request trace into a temporary directory -- input lengths
uniform in [600, 12000) tokens, outputs in [10, 600), 0-199 ms between requests, the first 0-5 ``hash_ids``
from a common pool (shared prefixes) and the rest fresh -- then runs ``harness.tools.tracestats stats`` on it in a
child process and prints its peak resident set size (``os.wait4``'s ``ru_maxrss``: that child's own) and
wall time. Target: under 1 GB for 10^6 requests (the in-memory replay needed ~23 KB per request).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_trace(path: Path, n: int, seed: int = 0) -> None:
    """The generated trace (module docstring), written in blocks of 10,000 lines."""
    rng = np.random.default_rng(seed)
    inp, out = rng.integers(600, 12000, n), rng.integers(10, 600, n)
    ts = np.cumsum(rng.integers(0, 200, n))
    nblk, shared = -(-inp // 512), rng.integers(0, 6, n)
    nxt = 1000
    with open(path, "w") as f:
        lines = []
        for i in range(n):
            k = int(nblk[i])
            s = min(int(shared[i]), k)
            ids = [*range(s), *range(nxt, nxt + k - s)]
            nxt += k - s
            lines.append('{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": [%s]}'
                         % (ts[i], inp[i], out[i], ", ".join(map(str, ids))))
            if len(lines) >= 10_000:
                f.write("\n".join(lines) + "\n")
                lines = []
        if lines:
            f.write("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", nargs="?", type=int, default=1_000_000, help="requests (lines)")
    ap.add_argument("--keep", type=Path, default=None, help="write the trace here and keep it")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = a.keep or Path(tmp) / "trace.jsonl"
        t0 = time.perf_counter()
        write_trace(path, a.n)
        print(f"wrote {path}: {a.n:,} requests, {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - t0:.1f} s")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        t0 = time.perf_counter()
        p = subprocess.Popen([sys.executable, "-m", "harness.tools.tracestats", "stats", str(path)], cwd=ROOT, env=env)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        print(f"harness.tools.tracestats stats: exit {os.waitstatus_to_exitcode(status)}, peak RSS {ru.ru_maxrss / 1024:.0f} MB "
              f"({ru.ru_maxrss * 1024 / a.n:.0f} bytes per request), {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
