#!/usr/bin/env bash
# Efficiency on one GPU, sized to finish in under 8 minutes on an H200 (configs/latency/gpu-h200.yaml):
# a Llama-3.1-8B-shaped model with random bf16 weights (nothing downloaded) at 32k, 64k and 128k tokens:
#   - prefill time (eviction at its end included) and eviction time alone: full cache / SnapKV / ReST-KV, budget 1024
#   - decode ms per token, full cache vs budget 1024, each with the dynamic (concatenating) and the preallocated
#     cache, next to the memory-bandwidth bound (the GPU's copy bandwidth is measured first)
#   - peak memory (torch.cuda.max_memory_allocated) of every configuration
# Writes results/efficiency/gpu-h200.json, gpu-h200-latency.png and gpu-h200-memory.png; commit them.
# --preset gpu-scoring instead times one Llama-3.1-8B layer's eviction decision alone (scores + top-k), ReST-KV
# against SnapKV at 32k-128k tokens (configs/latency/gpu-scoring.yaml; writes gpu-scoring.json and its plots).
#
#   scripts/efficiency_gpu.sh                        # the measurement (needs CUDA)
#   scripts/efficiency_gpu.sh --preset gpu-scoring   # the scoring cost on the GPU
#   scripts/efficiency_gpu.sh latency.shape=mistral-7b-v0.2 latency.name=gpu-h200-mistral   # other Hydra overrides
#   scripts/efficiency_gpu.sh --device cpu --tiny    # the same code path at toy sizes on a CPU, in seconds
#                                                    # (writes to ${TMPDIR:-/tmp}/restkv-efficiency unless overridden)
set -euo pipefail
cd "$(dirname "$0")/.."

device=cuda
preset=gpu-h200
tiny=0
overrides=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --device) device="$2"; shift 2 ;;
        --device=*) device="${1#--device=}"; shift ;;
        --tiny) tiny=1; shift ;;
        --preset) preset="$2"; shift 2 ;;
        --preset=*) preset="${1#--preset=}"; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) overrides+=("$1"); shift ;;
    esac
done

args=("latency=${preset}" "latency.device=${device}" "latency.out_dir=results/efficiency")  # the curated records
if [[ "${device}" == cuda* ]]; then
    python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || { echo "no CUDA device: run with --device cpu --tiny to check the pipeline" >&2; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
if [[ ${tiny} == 1 ]]; then
    args+=(
        latency.name="${preset}-tiny-${device}"
        latency.out_dir="${TMPDIR:-/tmp}/restkv-efficiency"
        latency.shape=tiny-llama
        "latency.contexts=[256,512]"
        "latency.budgets=[64]"
        "latency.decode_budgets=[64]"
        latency.decode_tokens=4
        latency.decode_warmup_tokens=1
        latency.bandwidth_mib=64
        latency.bandwidth_repeats=3
    )
fi

start=$(date +%s)
python -m restkv.eval.latency "${args[@]}" "${overrides[@]+"${overrides[@]}"}"
echo "efficiency_gpu.sh: $(( $(date +%s) - start )) s"
