#!/usr/bin/env bash
# Everything that needs a GPU, in one call, sized for under 8 minutes on one H200; results in results/gpu/:
#   1. the gpu-marked tests (tests/test_gpu.py: CUDA vs CPU decisions and decoding for sdpa and, when
#      flash_attn is installed, flash_attention_2, x GQA modes x ReST-KV / PyramidKV / AdaKV; float32 and
#      bfloat16 on the golden cases; fidelity memory over 40 samples; eval/run.py and the latency
#      benchmark on CUDA; tests/test_fast_path_fallback.py: no layout's fast path falls back)
#                                                                          -> results/gpu/pytest.xml, pytest.log
#   2. the fused varlen kernels (PyTorch's varlen_attn; flash-attn's where installed) against the reference
#      varlen path                                                      -> results/gpu/varlen-kernels-check.json
#   3. the efficiency benchmark (scripts/efficiency_gpu.sh) at 32k and 128k tokens, one repeat: prefill
#      overhead of ReST-KV and SnapKV, decode speedup and step / bandwidth bound (dynamic, preallocated and
#      static caches; the static one's step replayed as a CUDA graph), peak memory
#                                                                          -> results/gpu/gpu-check.json (+ plots)
#   4. throughput of the run path (scripts/throughput.py) on a Llama-3.1-8B-shaped model with random bf16
#      weights: RULER at 8k and 32k, SnapKV and ReST-KV at budget 1024, eager decoding vs the recorded step
#      (decode=graph): samples per hour, decode ms/token against the bound; then ReST-KV at 8k with 1, 8
#      and 32 prompts per decode step (decode_batch), 32 prompts        -> results/gpu/throughput.json
#   5. one layer's eviction decision at 32k and 128k tokens, budget 1024: SnapKV, ReST-KV (its GPU scoring
#      path), every ablation row and AdaKV, time and peak memory side by side (configs/latency/gpu-scoring.yaml)
#                                                                          -> results/gpu/gpu-scoring.json
#   6. the default fast paths checked against the eager ones on every layout (scripts/check_fast_paths.py:
#      dense, full, varlen, masked; one prompt and batched rows; any fallback fails the step)
#                                                                          -> results/gpu/fast-paths.json
#   7. the capacity benchmark, cut to 32k tokens and four budgets (configs/latency/capacity-gpu.yaml has the
#      whole sweep): the largest decode batch per budget for SnapKV, ReST-KV and head-wise ReST-KV, its total
#      tokens/s, time to first token, peak memory and ratio to the bandwidth bound
#                                                                          -> results/gpu/capacity.json, .md, .png
# (eval/run.py itself runs on CUDA in the gpu tests; the throughput step drives its answering code.)
# It prints one table of what passed (also results/gpu/summary.md and summary.json) and exits non-zero if
# anything failed. Every step runs even when an earlier one fails.
#
#   scripts/gpu_check.sh               # on the GPU
#   scripts/gpu_check.sh --dry-run     # the same steps at toy sizes on a CPU (checks the script; ~2 min)
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
[[ "${1:-}" == "--dry-run" ]] && dry=1
out=results/gpu
[[ ${dry} == 1 ]] && out="${TMPDIR:-/tmp}/restkv-gpu-check"
mkdir -p "${out}"
steps_file="${out}/steps.tsv"
: > "${steps_file}"

if [[ ${dry} == 0 ]]; then
    python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
        || { echo "gpu_check.sh: no CUDA device (scripts/gpu_check.sh --dry-run checks the steps on a CPU)" >&2; exit 1; }
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "${out}/device.txt" || true
fi
python - <<'EOF' | tee "${out}/versions.txt"
import importlib.util, platform, torch, transformers
print("python", platform.python_version(), "| torch", torch.__version__, "| transformers", transformers.__version__,
      "| flash_attn", "installed" if importlib.util.find_spec("flash_attn") else "absent",
      "| cuda", torch.version.cuda)
EOF

step() {  # step <name> <result file> <command...>: run it, log it, record status and seconds
    local name="$1" result="$2"; shift 2
    local start=$SECONDS
    echo "== ${name}: $*"
    "$@" > "${out}/${name}.log" 2>&1
    local status=$?
    tail -n 25 "${out}/${name}.log"
    printf '%s\t%s\t%s\t%s\n' "${name}" "${status}" "$((SECONDS - start))" "${result}" >> "${steps_file}"
}

# The capacity step's Hydra overrides, one line (tests/test_capacity.py composes them).
capacity_overrides=("latency.contexts=[32768]" "latency.capacity_budgets=[full,0.125,2048,256]")
capacity_dry=("latency=capacity" "latency.contexts=[512]" "latency.capacity_budgets=[full,0.25,64]" "latency.memory_cap_mib=4" "latency.capacity_max_batch=16" "latency.decode_tokens=2" "latency.repeats=1")

if [[ ${dry} == 1 ]]; then
    export RESTKV_GPU_TESTS_DEVICE=cpu
    step gpu-tests "${out}/pytest.xml" python -m pytest -q -m gpu tests/test_gpu.py tests/test_fast_path_fallback.py -k "not flash and (llama or not arch)" \
        --junitxml="${out}/pytest.xml"
    step efficiency "${TMPDIR:-/tmp}/restkv-efficiency/gpu-h200-tiny-cpu.json" scripts/efficiency_gpu.sh --device cpu --tiny \
        "latency.decode_caches=[dynamic,preallocated,static]"
    step scoring "${TMPDIR:-/tmp}/restkv-efficiency/gpu-scoring-tiny-cpu.json" scripts/efficiency_gpu.sh --device cpu \
        --tiny --preset gpu-scoring latency.dtype=float32 "latency.policies=[snapkv,restkv,ablation/recon_last,adakv]"
    shape=micro-llama; shape_config=models/micro-llama/config.json; device=cpu; dtype=float32; lengths="[1024]"; budget=64
    step throughput "${out}/throughput.json" python scripts/throughput.py --dry-run --out "${out}/throughput.json"
    step fast-paths "${out}/fast-paths.json" python scripts/check_fast_paths.py --dry-run --out "${out}/fast-paths.json"
    step capacity "${out}/capacity.json" python -m restkv.eval.latency "${capacity_dry[@]}" latency.name=capacity \
        latency.out_dir="${out}"
else
    step gpu-tests "${out}/pytest.xml" python -m pytest -q -m gpu tests/test_gpu.py tests/test_fast_path_fallback.py --junitxml="${out}/pytest.xml"
    step varlen-kernels "${out}/varlen-kernels-check.json" python scripts/check_varlen_kernels.py \
        --out "${out}/varlen-kernels-check.json"
    step efficiency "${out}/gpu-check.json" scripts/efficiency_gpu.sh latency.name=gpu-check latency.out_dir="${out}" \
        "latency.contexts=[32768,131072]" latency.repeats=1 "latency.decode_caches=[dynamic,preallocated,static]"
    step scoring "${out}/gpu-scoring.json" scripts/efficiency_gpu.sh --preset gpu-scoring latency.name=gpu-scoring \
        latency.out_dir="${out}" "latency.contexts=[32768,131072]"
    step fast-paths "${out}/fast-paths.json" python scripts/check_fast_paths.py --out "${out}/fast-paths.json"
    step capacity "${out}/capacity.json" python -m restkv.eval.latency latency=capacity-gpu "${capacity_overrides[@]}" \
        latency.name=capacity latency.out_dir="${out}"
    shape=llama-3.1-8b; shape_config=configs/shapes/llama-3.1-8b.json; device=cuda; dtype=bfloat16; lengths="[8192]"
    budget=1024
fi

# A model folder of the shape: its config.json and the micro model's tokenizer (random weights are built on the device).
model_dir="${TMPDIR:-/tmp}/restkv-${shape}-shape"
mkdir -p "${model_dir}"
cp "${shape_config}" "${model_dir}/config.json"
cp models/micro-llama/tokenizer.json models/micro-llama/tokenizer_config.json "${model_dir}/"
if [[ ${dry} == 0 ]]; then
    step throughput "${out}/throughput.json" python scripts/throughput.py --model-dir "${model_dir}" \
        --lengths 8192 32768 --policies snapkv restkv --budget 1024 --paths eager graph --samples 2 \
        --batches 1 8 32 --batch-lengths 8192 --batch-samples 32 --out "${out}/throughput.json"
fi

python - "${out}" <<'EOF'
import json, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, seconds, result = line.split("\t")
    detail = ""
    if name == "gpu-tests" and Path(result).is_file():
        suite = ET.parse(result).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        total, failed = int(suite.get("tests", 0)), int(suite.get("failures", 0)) + int(suite.get("errors", 0))
        skipped = int(suite.get("skipped", 0))
        detail = f"{total - failed - skipped} passed, {failed} failed, {skipped} skipped"
    elif name == "efficiency" and Path(result).is_file():
        ratios = json.loads(Path(result).read_text())["ratios"]
        longest = max(r["context"] for r in ratios["prefill"])
        prefill = [r for r in ratios["prefill"] if r["context"] == longest and r["policy"] == "restkv"]
        decode = [r for r in ratios["decode"] if r["context"] == longest and "speedup" in r]
        parts = [f"{longest} tokens"]
        parts += [f"ReST-KV prefill {r['prefill_vs_snapkv']}x SnapKV's" for r in prefill if "prefill_vs_snapkv" in r]
        parts += [f"{r['cache']}: decode {r['speedup']}x faster, step/bound {r['compressed_achieved_over_bound']}"
                  for r in decode]
        detail = "; ".join(parts)
    elif name == "scoring" and Path(result).is_file():
        ratios = json.loads(Path(result).read_text())["ratios"]["scoring"]
        detail = "; ".join(
            f"{r['context']} {r['variant']}: {r.get('time_vs_snapkv')}x SnapKV's time, {r.get('peak_memory_vs_snapkv')}x"
            " its peak" for r in ratios if r["variant"] in ("restkv", "adakv")
        )
    elif name == "throughput" and Path(result).is_file():
        measured = json.loads(Path(result).read_text())
        detail = "; ".join(
            f"{r['length']} {r['policy']} {r['path']}: {r['samples_per_hour']}/h, {r['decode_ms_per_token']} ms/token "
            f"({r['decode_over_bound']}x bound){'' if r['same_tokens_as_eager'] else ', TOKENS DIFFER'}"
            for r in measured["rows"]
        )
        detail += "; " + "; ".join(
            f"{r['length']} {r['policy']} decode_batch={r['decode_batch']}: {r['samples_per_hour']}/h"
            f"{'' if r['same_answers_as_first'] else ', ANSWERS DIFFER'}"
            for r in measured.get("batched", [])
        )
    elif name == "fast-paths" and Path(result).is_file():
        rows_ = json.loads(Path(result).read_text())["rows"]
        bad = [f"{r['case']}: {'; '.join(r['fallbacks'])}" for r in rows_ if not r["passed"]]
        paths = sorted({r["path"] for r in rows_})
        detail = f"{len(rows_) - len(bad)}/{len(rows_)} layouts kept their fast path (paths: {', '.join(paths)})"
        detail += "; FELL BACK: " + " | ".join(bad) if bad else ""
    elif name == "capacity" and Path(result).is_file():
        entries = json.loads(Path(result).read_text())["entries"]
        longest = max(e["context"] for e in entries)
        parts = []
        for e in (e for e in entries if e["context"] == longest):
            if e["tokens"] is None:
                parts.append(f"{longest} full: batch {e['batch']}, {e.get('tokens_per_second', 0):.0f} tok/s")
            else:
                parts.append(f"{e['policy']}@{e['budget']}: batch {e['batch']} ({e.get('batch_vs_full', '-')}x), "
                             f"{e.get('tokens_per_second', 0):.0f} tok/s ({e.get('throughput_vs_full', '-')}x full), "
                             f"{e.get('ratio_to_bound', 0):.2f} of bound")
        detail = "; ".join(parts)
    elif name.startswith("e2e-"):
        metrics = sorted(Path(result).rglob(f"{name[4:]}/*/metrics.json"))
        if metrics:
            m = json.loads(metrics[-1].read_text())
            detail = f"score {m.get('average')}, {sum((m.get('samples') or {}).values())} samples"
    rows.append({"step": name, "passed": status == "0", "seconds": int(seconds), "detail": detail, "result": result})
(out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
lines = ["| step | passed | seconds | detail | result |", "| --- | --- | --- | --- | --- |"]
lines += [f"| {r['step']} | {'yes' if r['passed'] else 'NO'} | {r['seconds']} | {r['detail']} | {r['result']} |" for r in rows]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(0 if all(r["passed"] for r in rows) else 1)
EOF
