"""Run the harness: ``python run.py [group=option ...] [key=value ...]`` (Hydra).

Defaults: ConServe on the shipped SWE-bench trace, simulated A40 cluster (1 prefiller + 3 decoders).
Sweep: ``python run.py -m scheduler=conserve,ampd workload.rate_per_s=0.1,0.2``.
Results go to ``results/runs/<time>_<scheduler>/`` (or ``results/sweeps/<time>/<n>_<scheduler>/``).
The same as the installed console script ``agentic-harness``: the body is ``harness.run.cli``.
See README.md and conf/README.md.
"""

from harness.run.cli import main

if __name__ == "__main__":
    main()
