#!/usr/bin/env bash
# Recipe v3 of models/micro-llama on one GPU, with more data per step than the CPU run could afford.
#
# The 2-core CPU run (2.66 h) left the multi-item tasks below target for want of training; a GPU
# trains the same 3.15M-parameter model, curriculum and evaluation on BATCH_SCALE times the data
# per step. Batches are made ahead by worker processes, the forward passes run under bfloat16
# autocast, and --max-hours ends the run early if it overruns (later phases are then skipped).
# BATCH_SCALE "auto" (the default) times a few steps of every stage first
# (scripts/estimate_training_time.py) and takes the largest of 8, 4, 2, 1 whose estimate fits
# 70 % of MAX_HOURS (the rest is for the held-out evaluations); OUTPUT_DIR/estimate.txt keeps it.
# Writes OUTPUT_DIR/export (the Hugging Face folder, its training_log.json included), OUTPUT_DIR/train.log
# and OUTPUT_DIR/eval.json (full cache, micro suite and RULER's single and multi-key needles, 2048 and
# 4096 tokens, 20 prompts each). To ship the result, copy OUTPUT_DIR/export over models/micro-llama
# and update its model card.
#
#   scripts/train_micro_model_gpu.sh OUTPUT_DIR [BATCH_SCALE=auto] [MAX_HOURS=0.12]
#   scripts/train_micro_model_gpu.sh OUTPUT_DIR 1 0.01 --device cpu --smoke   # the same path on a CPU, in minutes
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:?usage: scripts/train_micro_model_gpu.sh OUTPUT_DIR [BATCH_SCALE] [MAX_HOURS] [extra training flags]}
scale=${2:-auto}
hours=${3:-0.12}
shift $(( $# < 3 ? $# : 3 ))
device=cuda
samples=20
for flag in "$@"; do
    [[ "$flag" == cpu ]] && device=cpu
    [[ "$flag" == --smoke ]] && samples=1
done
if [[ "$device" == cuda ]]; then
    python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || { echo "no CUDA device (pass --device cpu --smoke to check the pipeline)" >&2; exit 1; }
fi
workers=$(( $(nproc) > 3 ? $(nproc) - 2 : 1 ))
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if [[ "$scale" == auto ]]; then
    fit=$(python -c "print(round(0.7 * $hours, 4))")
    python scripts/estimate_training_time.py --device "$device" --precision bf16 --batch-scale 8 \
        --workers "$workers" --steps 2 --fit-hours "$fit" 2>&1 | tee "$out/estimate.txt"
    scale=$(tail -n 1 "$out/estimate.txt" | awk '{print $NF}')
    [[ "$scale" -ge 1 ]] || { echo "even batch x1 is estimated over $fit h: see $out/estimate.txt" >&2; exit 1; }
fi
work="outputs/micro_model_v3_gpu_batch${scale}"
mkdir -p "$work/tokenizer"
# the shipped tokenizer is the one recipe v3 trains (same corpus, same seed): skip retraining it
cp models/micro-llama/tokenizer.json models/micro-llama/tokenizer_config.json "$work/tokenizer/"

python scripts/train_micro_model.py --recipe v3 --device cuda --precision bf16 --batch-scale "$scale" \
    --workers "$workers" --max-hours "$hours" --save-every 600 --work-dir "$work" --export-dir "$out/export" \
    --resume "$@" 2>&1 | tee "$out/train.log"
tasks=micro_single_1,micro_single_2,micro_multikey_1,micro_multikey_2,micro_multivalue,micro_multiquery,micro_vt
tasks+=,passkey,niah_single_1,niah_single_2,niah_multikey_1,niah_multikey_2
python scripts/eval_micro_model.py --model "$out/export" --device "$device" --lengths 2048,4096 --samples "$samples" \
    --tasks "$tasks" --out "$out/eval.json" | grep '^full'
