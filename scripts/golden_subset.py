"""Write the subset of the authors' recorded eviction calls that ships in the repository (``tests/golden/``).

    python scripts/golden_subset.py --full /path/to/golden --out tests/golden

The parity tests (``tests/test_golden*.py``) replay the cases of a fixture folder: ``RESTKV_GOLDEN`` when set (the
full set: 41 selection and 23 head-wise cases, 26 MB), else the subset written here, which keeps every distinct
configuration family at its smallest size: each ReST-KV knob combination once, the ablation's indicator, temporal
and spatial switches, SnapKV's two poolings, StreamingLLM, PyramidKV's layer budgets, and one call of each head-wise
method (AdaKV, HeadKV, L2Norm, CAM, ThinK). Cases are copied unchanged (JSON entries and tensors).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

SUBSET = {
    "official_selection": (
        *(f"restkv_{i}" for i in range(18, 27)),  # the nine ReST-KV configurations, at 300 tokens
        "ablation_00",
        "ablation_01",
        "ablation_04",
        "ablation_08",  # attn, attn-v, inv-ema, ema + adaptive
        "snapkv_00",
        "snapkv_01",  # average and max pooling
        "streamingllm_01",
    ),
    "official_headwise": ("adakv_07", "adakv_09", "headkv_00", "l2norm_00", "cam_00", "think_00"),
}
"""Per fixture file, the case names kept."""


def write_subset(full: Path, out: Path) -> dict[str, int]:
    """Copy the `SUBSET` cases of ``full`` into ``out``; return the number of cases written per file."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for stem, names in SUBSET.items():
        index = json.loads((full / f"{stem}.json").read_text(encoding="utf-8"))
        known = {case["name"] for case in index["cases"]}
        missing = sorted(set(names) - known)
        if missing:
            raise SystemExit(f"{full / f'{stem}.json'} has no case {', '.join(missing)}: is it a fixture folder?")
        index["cases"] = [case for case in index["cases"] if case["name"] in names]
        with safe_open(str(full / f"{stem}.safetensors"), "pt") as tensors:
            stored = tensors.keys()  # a safetensors handle is not iterable itself
            kept = {key: tensors.get_tensor(key) for key in stored if key.split(".", 1)[0] in names}
        save_file(kept, str(out / f"{stem}.safetensors"))
        (out / f"{stem}.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
        written[stem] = len(index["cases"])
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", type=Path, required=True, help="the full fixture folder")
    parser.add_argument("--out", type=Path, default=Path("tests/golden"), help="where the subset goes")
    args = parser.parse_args()
    for stem, count in write_subset(args.full, args.out).items():
        print(f"{args.out / stem}.{{json,safetensors}}: {count} cases")


if __name__ == "__main__":
    main()
