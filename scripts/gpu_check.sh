#!/usr/bin/env bash
# The GPU checks of the distributed runtime, as one prepared script for a machine with a CUDA GPU, torch and
# NCCL, and no network (no vLLM, SGLang or Ray needed). Under 10 minutes. Run from the repository root:
#
#     bash scripts/gpu_check.sh            # writes gpu_check.log (and $OUT/gpu_check.log when $OUT is set)
#
# It runs the `gpu`-marked tests that need torch only:
#   - FSDP2 on CUDA at world 1, bf16 parameters / fp32 gradient reduction, a 32k-token packed batch
#     (tests/distributed/test_gpu.py);
#   - the colocated CUDA-IPC hand-off between two processes on one GPU (tests/engine/test_cuda_ipc.py);
#   - the packed forward with SDPA / varlen attention in bf16 and fp32 (tests/models/test_forward.py);
#   - the NCCL weight broadcast when the machine has >= 3 GPUs (tests/engine/test_weight_broadcast.py).
set -uo pipefail
export HF_HUB_OFFLINE=1 PYTHONPATH="${PYTHONPATH:-}:$(pwd)/src"
PY="${PYTHON:-python3}"
LOG="gpu_check.log"
{
  echo "== $(date -u) on $(hostname)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  # the package's own dependencies that a bare torch machine may lack are checked, not installed
  "$PY" -c "import transformers, pydantic, hypothesis" 2>&1 || echo "missing Python packages: install sao's dependencies first"
  timeout 540 "$PY" -m pytest -q -p no:cacheprovider -m gpu -rA \
    tests/distributed/test_gpu.py tests/engine/test_cuda_ipc.py tests/models/test_forward.py \
    tests/engine/test_weight_broadcast.py
  echo "== exit $?"
} 2>&1 | tee "$LOG"
[ -n "${OUT:-}" ] && cp "$LOG" "$OUT/" || true
