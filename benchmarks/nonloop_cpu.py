"""CPU of ``python run.py`` outside the simulation loop: runs the command line in this process with
``harness.core.clock.SimClock.run`` timed (``time.process_time``, s), and prints one line to stderr::

    NONLOOP total_cpu=<s> loop=<s> nonloop=<s>

``total_cpu`` is this process's user + system CPU (``os.times``) when ``main()`` returns, so interpreter exit is
left out (``/usr/bin/time`` around this script adds it). ``loop`` is every ``SimClock.run`` of the process, SLO
baseline replays included (warm them first, or keep ``$HARNESS_CACHE_DIR`` filled). ``nonloop`` is the
difference: imports, Hydra, trace and workload, the frames, the result files. Every argument goes to
``run.py``, e.g. (docs/speed.md; keep bytecode as users do: ``PYTHONDONTWRITEBYTECODE`` unset)::

    HARNESS_CACHE_DIR=/tmp/cache PYTHONPATH=. nice -n 19 /usr/bin/time -f "%U+%S" \\
        python benchmarks/nonloop_cpu.py hydra.run.dir=/tmp/r1 logger.progress=false
    ... python benchmarks/nonloop_cpu.py -m hydra/launcher=joblib hydra.launcher.n_jobs=1 \\
        workload.rate_per_s=0.02,0.05 workload.seed=0,1 hydra.sweep.dir=/tmp/s1   # a sweep, in one process

The exit status is ``run.py``'s. A measurement tool, not a test: the machine's load moves both numbers, so
compare checkouts by interleaved runs.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    """Run ``run.py``'s command line on ``sys.argv[1:]`` with the loop timed; print the split to stderr."""
    sys.argv = ["run.py", *sys.argv[1:]]
    import harness.run.cli as cli
    from harness.core import clock

    loop = [0.0]
    run = clock.SimClock.run

    def timed(self, *a, **k):
        t0 = time.process_time()
        try:
            return run(self, *a, **k)
        finally:
            loop[0] += time.process_time() - t0

    clock.SimClock.run = timed
    try:
        cli.main()
    finally:
        t = os.times()
        total = t.user + t.system
        print(f"NONLOOP total_cpu={total:.3f} loop={loop[0]:.3f} nonloop={total - loop[0]:.3f}", file=sys.stderr)


if __name__ == "__main__":
    main()
