#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with one CUDA GPU, torch and no network (no vLLM, SGLang
# or Ray needed). Under 10 minutes. Run from the repository root:
#
#     bash scripts/gpu_check.sh --fetch-wheels   # here, with network: the Python packages sao needs that a
#                                                # bare torch image lacks, as wheels into .whl/ (~3 MB; add
#                                                # /.whl/ to .git/info/exclude and carry it)
#     bash scripts/gpu_check.sh                  # there: installs .whl/ (if present) into /tmp/site, then
#                                                # writes runs/gpu_check/gpu_check.log (and to $OUT: the
#                                                # log, gpu_check.json, gpu_check_metrics.jsonl)
#     bash scripts/gpu_check.sh --dry-run        # anywhere: step 1 on the CPU with a tiny shape
#
# 1. scripts/gpu_check.py (about 3-5 minutes on an H100): writes a Qwen3-0.6B-shaped random-init checkpoint
#    on the GPU (scripts/shaped_checkpoint.py: sharded bf16 safetensors, the BPE tokenizer, the qwen3
#    template), then runs `sao train configs/gpu_check.yaml` through the CLI in-process: SAO on one GPU with
#    the local runtime, bf16 compute / fp32 master weights, activation checkpointing, the local engine on
#    CUDA, 3 synchronous steps of one ~16k-token micro-batch. It prints the trainer step's tokens/s, the
#    peak GPU memory of each trainer step against `sao plan`'s prediction (sao.plan.memory), and the
#    on-policy DIS ratio (dis/ratio_mean, dis/logprob_abs_diff, lag/token_max).
# 2. With the time left (GPU_CHECK_TESTS=0 skips it), the `gpu`-marked tests that need torch only: FSDP2 on
#    CUDA at world 1 with a 32k-token packed batch (tests/distributed/test_gpu.py), the colocated CUDA-IPC
#    hand-off (tests/engine/test_cuda_ipc.py), the packed forward in bf16 and fp32
#    (tests/models/test_forward.py), the NCCL weight broadcast with >= 3 GPUs
#    (tests/engine/test_weight_broadcast.py).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
# sao's dependencies missing from the GPU image (torch, transformers, tokenizers, safetensors, typer, rich,
# pyyaml, numpy, scipy, numba are there; checked against its package list, 2026-11). Python 3.12 wheels.
WHEELS="pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 starlette==1.10.0"

CHECK_ARGS=()
if [ "${1:-}" = "--dry-run" ]; then  # the same path on the CPU with a tiny shape (under a minute), no tests
  CHECK_ARGS=(--device cpu --tiny)
  GPU_CHECK_TESTS=0
fi
if [ "${1:-}" = "--fetch-wheels" ]; then
  exec "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl $WHEELS
fi

export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$(pwd)/src:${PYTHONPATH:-}"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
mkdir -p runs/gpu_check
LOG="runs/gpu_check/gpu_check.log"
START=$(date +%s)
{
  echo "== $(date -u) on $(hostname)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'devices', torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  # the dependencies are checked, not installed from the network (there is none)
  "$PY" -c "import pydantic, starlette, transformers, typer, rich, yaml, safetensors, tokenizers" 2>&1 \
    || echo "missing Python packages: run 'bash scripts/gpu_check.sh --fetch-wheels' where pip works and carry .whl"
  echo "== sao train on one GPU (scripts/gpu_check.py)"
  timeout 420 "$PY" scripts/gpu_check.py "${CHECK_ARGS[@]}" --out "${OUT:-runs/gpu_check}"
  echo "== gpu_check.py exit $?"
  LEFT=$((570 - $(date +%s) + START))
  if [ "${GPU_CHECK_TESTS:-1}" = "1" ] && [ "$LEFT" -gt 60 ]; then
    echo "== gpu-marked tests ($LEFT s left)"
    timeout "$LEFT" "$PY" -m pytest -q -p no:cacheprovider -m gpu -rA \
      tests/distributed/test_gpu.py tests/engine/test_cuda_ipc.py tests/models/test_forward.py \
      tests/engine/test_weight_broadcast.py
    echo "== pytest exit $?"
  fi
  echo "== done in $(($(date +%s) - START)) s"
} 2>&1 | tee "$LOG"
[ -n "${OUT:-}" ] && cp "$LOG" "$OUT/" || true
