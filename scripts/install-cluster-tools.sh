#!/usr/bin/env bash
# Install what the cluster tests (tests/test_clusters.py) need: the [slurm] and [ray] extras (Hydra's
# submitit and Ray launchers, Ray itself) and, on a Debian/Ubuntu machine where we are root, Slurm from
# the distribution's slurm-wlm package (slurmctld + slurmd; tests/slurm_local.py starts a single-node
# cluster on loopback from it). Idempotent. Where Slurm cannot be installed (not root, no apt-get) the
# Slurm tests are skipped and say why. Takes ~1 min (Ray's wheel) plus ~1 min for slurm-wlm.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet -e '.[slurm,ray]'
if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null; then
  echo "slurm-wlm already installed"
elif [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq slurm-wlm >/dev/null
  echo "installed slurm-wlm $(dpkg-query -W -f='${Version}' slurm-wlm)"
else
  echo "slurm-wlm not installed (needs root and apt-get): the Slurm tests will be skipped"
fi
