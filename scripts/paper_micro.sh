#!/usr/bin/env bash
# The micro-scale paper on a CPU: every artifact's runs on the micro model, then every figure and table.
#   bash scripts/paper_micro.sh [results root, default results/paper_micro] [extra overrides for every run...]
# Parts (each a Hydra multirun, resumable: rerun the script after a kill and finished samples are kept):
# experiment=paper_micro (main grid), paper_micro/{ablation,alpha,scale,niah,quant}, and the latency
# benchmark's tiny preset. Figures go to <root>/figures (scripts/make_figures.py all).
# Parallel cells: add hydra/launcher=joblib hydra.launcher.n_jobs=2 (one process per cell).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-results/paper_micro}
shift || true
export TQDM_DISABLE=${TQDM_DISABLE:-1}
start=$SECONDS
for part in paper_micro paper_micro/ablation paper_micro/alpha paper_micro/scale paper_micro/niah paper_micro/quant; do
    part_start=$SECONDS
    python eval/run.py experiment="$part" out_dir="$ROOT" "$@" > "$ROOT.${part//\//_}.log" 2>&1 \
        || { echo "paper_micro: $part failed; see $ROOT.${part//\//_}.log" >&2; exit 1; }
    echo "paper_micro: $part done in $((SECONDS - part_start)) s"
done
python -m restkv.eval.latency latency=tiny latency.out_dir="$ROOT/efficiency" > "$ROOT.latency.log" 2>&1 \
    || { echo "paper_micro: latency failed; see $ROOT.latency.log" >&2; exit 1; }
echo "paper_micro: latency done; all runs in $((SECONDS - start)) s"
python scripts/make_figures.py all --runs "$ROOT"
echo "paper_micro: finished in $((SECONDS - start)) s"
