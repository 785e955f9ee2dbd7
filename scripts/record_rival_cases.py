"""Record what the DefensiveKV and R-KV authors' own selection code keeps, on inputs generated here.

    python scripts/record_rival_cases.py --defensivekv /path/to/DefensiveKV --rkv /path/to/R-KV \\
        --out /path/to/rivals-full --subset-out tests/golden

The two paths are checkouts (or exported trees) of the authors' repositories; every file read is checked against
its git blob hash at the commit in `SOURCES`. Nothing of theirs is copied: their files are imported from the
checkout (stub packages in `sys.modules` while they import, so an installed `kvpress` is untouched) and run on CPU
in float32. `NOTES` (written into each JSON) says what runs. DefensiveKV: their `compress` on their flattened cache
with a fake attention module; `kvpress/ops/vw_norm.py` needs triton, so it is stubbed and each press's
`vwl1norm_triton` is replaced by the same class's pure-torch `vwl1norm` (their per-head loop computing the same L1
norms of `W_o^h v`). R-KV: their `R1KV.update_kv`, alone and in their decode loop, whose schedule `rkv_loop` follows
line by line from `rkv/modeling.py`. Decode step k >= 1 is the forward that appends the k-th generated token's key
(absolute position prompt_len + k - 1); step 0 is the prefill.

Output: per family `rivals_<family>.json` + `.safetensors` (format in tests/golden/README.md), the full set in
``--out`` and a subset (every regime once, small tie-free cases first, ~3 MB in all) in ``--subset-out``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import types
from collections import namedtuple
from functools import partial
from pathlib import Path

import torch
from rival_sources import SOURCES, check_tree, load_defensivekv, load_rkv
from safetensors.torch import save_file
from torch import nn

REGIMES = ("gaussian", "spiky", "heavy", "duplicated")
WINDOW_DKV, KERNEL_DKV = 32, 5
RKV = {"window_size": 8, "kernel_size": 7, "mix_lambda": 0.07, "retain_ratio": 0.2, "retain_direction": "last"}
DIVIDE_LENGTH = 128
NOTES = {
    "defensivekv": [
        "EfficientDefensiveKVPress.compress once, as their forward hook calls it after a prefill, on their "
        "DynamicCacheSplitHeadFlatten (prefill update); attentions=None (flash attention in their runs)",
        "fake attention module: identity q_proj (the window queries are the last hidden states), identity RoPE, "
        "o_proj = o_proj_weight; vwl1norm_triton (a triton kernel) replaced by the class's pure-torch vwl1norm",
        "kept: their returned rows matched to the input value rows of each head; scores: what their score() "
        "returned, [1, kv*seq_len], the window padded with the layer maximum",
        "stage1_count_max = int((seq_len - window) * (1 - r) - window), their clamp of the stage-1 count; when "
        "negative, sorted_indices[:k] marks all but the last |k| tokens (ties at the maximum)",
    ],
    "layer_defensivekv": [
        "EfficientLayerDefensiveKVPress.compress on layers 0..n-1 in order, one press and one cache: the last "
        "layer's call runs their global top-k and layer_compress per layer; otherwise as `defensivekv`",
    ],
    "rkv_select": [
        "R1KV(budget, window_size=8, kernel_size=7, mix_lambda=0.07, retain_ratio=0.2, retain_direction='last', "
        "first_tokens=4).update_kv(keys, queries, values) once (cal_similarity's threshold: its default 0.5)",
        "values[..., 0] = absolute position (R-KV never reads values); kept: that channel of the returned values, "
        "in their cache order (top-k score order, then the window)",
    ],
    "rkv_loop": [
        "their decode loop, one sample and one layer, from a fresh state (flag None, length unset: their run's "
        "first sample); every cut by the real R1KV.update_kv, settings as rkv_select",
    ],
}
"""What each family runs, written into its JSON."""
STEP_DEFINITION = (
    "decode step k >= 1 is the forward that appends the k-th generated token's key (absolute position "
    "prompt_len + k - 1); step 0 is the prefill. update_kv runs at step 0 (flag None) and at every step k whose "
    "previous forward left length % divide_length == 0, i.e. (prompt_len + k - 1) % divide_length == 0, after the "
    "new key is appended; it evicts only when the cache holds at least `budget` tokens"
)


Shape = namedtuple("Shape", "heads kv_heads head_dim")  # query heads, key/value heads, head dimension


def randn(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float32)


def make_qk(g: torch.Generator, regime: str, s: Shape, n_keys: int, n_q: int, q_scale: float = 1.0):
    """Queries [1, heads, n_q, d] (the last n_q positions) and keys [1, kv, n_keys, d]; `regime` joins with "+":
    `gaussian`; `heavy` (Student-t keys, 3 dof); `spiky` (3-8 keys aligned with a direction every query of their group
    shares); `duplicated` (an eighth of the keys exact copies, another eighth near-copies (1e-3) of earlier keys)."""
    group, tags = s.heads // s.kv_heads, set(regime.split("+"))
    q, k = randn(g, 1, s.heads, n_q, s.head_dim), randn(g, 1, s.kv_heads, n_keys, s.head_dim)
    if "heavy" in tags:
        k = k / randn(g, 1, s.kv_heads, n_keys, 3).pow(2).mean(-1, keepdim=True).sqrt()
    if "spiky" in tags:
        topic = randn(g, 1, s.kv_heads, 1, s.head_dim)
        topic = topic / topic.norm(dim=-1, keepdim=True) * s.head_dim**0.5
        q = q + 0.6 * topic.repeat_interleave(group, dim=1)
        spikes = torch.randperm(n_keys, generator=g)[: int(torch.randint(3, 9, (1,), generator=g))]
        k[:, :, spikes] = 1.5 * topic + 0.1 * randn(g, 1, s.kv_heads, len(spikes), s.head_dim)
    if "duplicated" in tags:
        n = max(2, n_keys // 8)
        dst = torch.randperm(n_keys - 1, generator=g)[: 2 * n] + 1
        src = (torch.rand(2 * n, generator=g) * dst).long()
        for i, (a, b) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            k[:, :, b] = k[:, :, a] + (0.0 if i < n else 1e-3 * randn(g, 1, s.kv_heads, s.head_dim))
    return q * q_scale, k


class FakeAttention(nn.Module):
    """The attributes their presses read from a Llama attention layer: config, head_dim, layer_idx,
    num_key_value_groups, q_proj (identity: the hidden states are the queries) and o_proj."""

    def __init__(self, s: Shape, layer_idx: int, layers: int, o_weight: torch.Tensor):
        super().__init__()
        hidden = s.heads * s.head_dim
        names = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "num_hidden_layers")
        self.config = types.SimpleNamespace(**dict(zip(names, (*s, hidden, layers), strict=True)))
        self.head_dim, self.layer_idx = s.head_dim, layer_idx
        self.num_key_value_groups = s.heads // s.kv_heads
        self.q_proj, self.o_proj = nn.Linear(hidden, hidden, bias=False), nn.Linear(hidden, hidden, bias=False)
        self.q_proj.weight, self.o_proj.weight = nn.Parameter(torch.eye(hidden)), nn.Parameter(o_weight.clone())


def dkv_layer_inputs(g: torch.Generator, regime: str, s: Shape, seq_len: int, q_scale: float) -> dict:
    """One layer's window queries, keys, values (norms vary by token, log-normal) and output projection."""
    (q, k), hidden = make_qk(g, regime, s, seq_len, WINDOW_DKV, q_scale), s.heads * s.head_dim
    values = randn(g, 1, s.kv_heads, seq_len, s.head_dim) * torch.exp(0.5 * randn(g, 1, s.kv_heads, seq_len, 1))
    return {"q": q, "keys": k, "values": values, "o": randn(g, hidden, hidden) / hidden**0.5}


def run_dkv(classes: dict, layer: bool, s: Shape, layers: list[dict], ratio: float):
    """Run their press over every layer as their forward hook would (prefill), return per layer the kept mask
    [kv, L], their flattened scores and the window queries their code computed."""
    n, seq_len = len(layers), layers[0]["keys"].shape[2]
    press_class = classes["layer" if layer else "one"]
    press = press_class(compression_ratio=ratio, window_size=WINDOW_DKV, kernel_size=KERNEL_DKV)
    press.vwl1norm_triton = press.vwl1norm  # their pure-torch twin of the triton path (see the docstring)
    captured, score = [], press.score

    def capture(*args, **kwargs):  # keeps a copy of each layer's flattened scores, passes them on unchanged
        out = score(*args, **kwargs)
        captured.append(out.clone())
        return out

    press.score = capture
    cache = classes["cache"]()
    cos, sin = torch.ones(1, seq_len, s.head_dim), torch.zeros(1, seq_len, s.head_dim)
    modules, queries = [], []
    for idx, lay in enumerate(layers):
        cache.update(lay["keys"], lay["values"], idx)
        module = FakeAttention(s, idx, n, lay["o"])
        hidden_states = torch.zeros(1, seq_len, s.heads * s.head_dim)
        hidden_states[0, -WINDOW_DKV:] = lay["q"][0].transpose(0, 1).reshape(WINDOW_DKV, -1)
        modules.append((module, hidden_states))
        with torch.no_grad():
            qs = module.q_proj(hidden_states[:, -WINDOW_DKV:]).view(1, WINDOW_DKV, s.heads, s.head_dim)
        queries.append(qs.transpose(1, 2).contiguous())
    kw = {"past_key_values": cache, "position_embeddings": (cos, sin)}
    for idx, (module, hidden_states) in enumerate(modules):
        keys, values = cache.key_cache[idx], cache.value_cache[idx]
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # layer_compress prints a warning
            cache.key_cache[idx], cache.value_cache[idx] = press.compress(module, hidden_states, keys, values, None, kw)
    lens = [m.head_lens for m in cache.metadata_list]  # the cache is written back as their forward_hook does
    return [kept_mask(lay["values"], cache.value_cache[i], lens[i]) for i, lay in enumerate(layers)], captured, queries


def kept_mask(values: torch.Tensor, flat: torch.Tensor, head_lens: torch.Tensor) -> torch.Tensor:
    """Which positions their flattened cache kept, per head: each returned row matched to its input row."""
    kv, seq_len = values.shape[1], values.shape[2]
    mask, start = torch.zeros(kv, seq_len, dtype=torch.uint8), 0
    for h, length in enumerate(head_lens.reshape(-1).tolist()):
        rows = {values[0, h, p].numpy().tobytes(): p for p in range(seq_len)}
        if len(rows) != seq_len:
            raise RuntimeError("value rows of a head are not unique: kept positions cannot be read back")
        for row in flat[start : start + length]:
            mask[h, rows[row.numpy().tobytes()]] = 1
        start += length
    if start != flat.shape[0]:
        raise RuntimeError(f"head lengths sum to {start}, the cache holds {flat.shape[0]} rows")
    return mask


def tie_at_cutoff(scores: torch.Tensor, k: int) -> bool:
    """Whether the k-th and (k+1)-th largest scores are equal (then which one is kept is torch.topk's choice)."""
    flat = scores.reshape(-1).sort(descending=True).values
    return 0 < k < flat.numel() and bool(flat[k - 1] == flat[k])


def dkv_case(classes: dict, layer: bool, i: int, tensors: dict) -> dict:
    g = torch.Generator().manual_seed((20_000 if layer else 10_000) + i)
    small = i < (6 if layer else 8)  # the first cases are small (the subset's candidates), the others varied
    if layer:  # every layer has its own tensors and output projection
        s = Shape(*[(4, 2, 32), (8, 2, 32), (4, 4, 32), (4, 2, 32), (8, 4, 32), (4, 2, 64), (6, 2, 32)][i % 7])
        seq_len, n = [100, 150, 200, 256, 130, 300][i % 6], [3, 4, 5, 3, 6][i % 5]
    else:
        s = Shape(*[(4, 2, 32), (8, 2, 32), (4, 2, 64), (8, 4, 32), (4, 4, 64), (6, 2, 32), (4, 2, 128)][i % 7])
        seq_len, n = [100, 160, 256, 333, 420, 600, 200, 130][i % 8], 1
    if small:
        s, seq_len, n = Shape(4, 2 * (1 + i // 4 % 2), 32), [100, 130, 160, 200][i % 4], 3 if layer else 1
    ratio = [0.3, 0.55, 0.7, 0.875, 0.5, 0.25, 0.8][i % 7] if layer else [0.3, 0.55, 0.7, 0.875, 0.5, 0.25][i % 6]
    regimes = [REGIMES[(i + j) % 4] for j in range(n)]
    scales = [[1.0, 0.3, 2.5, 1.0, 0.6, 4.0][(i + 2 * j) % 6] for j in range(n)] if layer else [1.0]
    layers = [dkv_layer_inputs(g, r, s, seq_len, sc) for r, sc in zip(regimes, scales, strict=True)]
    masks, scores, queries = run_dkv(classes, layer, s, layers, ratio)
    name = f"{'layer_' if layer else ''}defensivekv_{i:02d}"
    case = {
        "name": name,
        "seed": (20_000 if layer else 10_000) + i,
        "regime": regimes if layer else regimes[0],
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "seq_len": seq_len,
        "head_dim": s.head_dim,
        "hidden_size": s.heads * s.head_dim,
        "window_size": WINDOW_DKV,
        "kernel_size": KERNEL_DKV,
        "compression_ratio": ratio,
        "keep_fraction": 1 - ratio,
        "stage1_count_max": int((seq_len - WINDOW_DKV) * (1 - ratio) - WINDOW_DKV),
    }
    window, kept = slice(seq_len - WINDOW_DKV, None), [int(m.sum()) for m in masks]
    case |= (
        {
            "num_hidden_layers": n,
            "layers": n,
            "query_scale": scales,
            "kept_per_layer": kept,
            "window_kept_per_layer": [int(m[:, window].sum()) for m in masks],
            "tie_at_global_cutoff": tie_at_cutoff(torch.stack(scores), sum(kept)),
            "tie_at_layer_cutoff": [tie_at_cutoff(sc, k) for sc, k in zip(scores, kept, strict=True)],
        }
        if layer
        else {
            "kept_per_head": masks[0].sum(1).tolist(),
            "window_kept_per_head": masks[0][:, window].sum(1).tolist(),
            "tie_at_cutoff": tie_at_cutoff(scores[0], kept[0]),
        }
    )
    for idx, (lay, mask, sc, q) in enumerate(zip(layers, masks, scores, queries, strict=True)):
        prefix = f"{name}.L{idx}."  # one layer for `defensivekv`: L0
        tensors |= {prefix + "queries": q, prefix + "keys": lay["keys"], prefix + "values": lay["values"]}
        tensors |= {prefix + "o_proj_weight": lay["o"], prefix + "kept": mask, prefix + "scores": sc}
    return case


def rkv_values(g: torch.Generator, s: Shape, n: int) -> torch.Tensor:
    """Random values whose channel 0 is the absolute position (exact in float32 below 2**24)."""
    values = randn(g, 1, s.kv_heads, n, s.head_dim)
    values[..., 0] = torch.arange(n, dtype=torch.float32)
    return values


def rkv_cluster(r1kv: type, budget: int):
    return r1kv(budget=budget, first_tokens=4, **RKV)  # run_math.py passes first_tokens; R1KV ignores it


def positions(values: torch.Tensor) -> torch.Tensor:
    return values[..., 0].round().long()


def rkv_select_case(r1kv: type, i: int, tensors: dict) -> dict:
    seed, g = 30_000 + i, torch.Generator().manual_seed(30_000 + i)
    s = Shape(*[(4, 2, 32), (8, 2, 64), (8, 4, 32), (4, 4, 64), (6, 3, 32), (4, 2, 128)][i % 6])
    budget, regime, scale = [64, 128, 96, 192, 256][i % 5], REGIMES[i % 4], [1.0, 2.0, 0.5][i % 3]
    seq_len = budget if i % 13 == 7 else max(budget + 1, [100, 180, 257, 300, 420, 600, 150][i % 7])
    (q, k), values = make_qk(g, regime, s, seq_len, RKV["window_size"], scale), rkv_values(g, s, seq_len)
    _, out = rkv_cluster(r1kv, budget).update_kv(k, q, values)
    name = f"rkv_select_{i:02d}"
    tensors |= {f"{name}.queries": q, f"{name}.keys": k, f"{name}.values": values, f"{name}.kept": positions(out)}
    return {
        "name": name,
        "seed": seed,
        "regime": regime,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "seq_len": seq_len,
        "head_dim": s.head_dim,
        "budget": budget,
        **RKV,
        "query_scale": scale,
    }


def rkv_loop(r1kv: type, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prompt: int, steps: int, budget: int):
    """Their decode loop for one sample and one layer, from a fresh state; returns the cuts as
    (step, cache length at the call, kept positions in cache order) and the steps whose update_kv evicted nothing."""
    cluster, w, cuts, idle = rkv_cluster(r1kv, budget), RKV["window_size"], [], []
    # prefill forward: CausalLM_forward sets length (l. 560-561); attention: query cache = last window queries
    # (l. 105-113); flag None -> update_kv on the prompt's keys, its result stored (l. 130-143)
    length, query_cache = prompt, q[:, :, prompt - w : prompt]
    ck, cv = cluster.update_kv(k[:, :, :prompt], query_cache, v[:, :, :prompt])
    (cuts.append((0, prompt, positions(cv))) if prompt >= budget else idle.append(0))
    flag = length % DIVIDE_LENGTH == 0  # l. 600-610, read by the next forward
    for step in range(1, steps + 1):
        pos = prompt + step - 1  # the k-th generated token's position
        length += 1  # l. 563
        query_cache = torch.cat([query_cache, q[:, :, pos : pos + 1]], dim=2)[:, :, -w:]  # l. 115-125
        ck, cv = torch.cat([ck, k[:, :, pos : pos + 1]], dim=2), torch.cat([cv, v[:, :, pos : pos + 1]], dim=2)
        if flag:  # l. 152-168: cache update first, then update_kv on the whole cache, result replaces the cache
            before = ck.shape[2]
            ck, cv = cluster.update_kv(ck, query_cache, cv)
            (cuts.append((step, before, positions(cv))) if before >= budget else idle.append(step))
        flag = length % DIVIDE_LENGTH == 0
    return cuts, idle


def steps_for_cuts(prompt: int, n_cuts: int) -> int:
    """Decode steps needed for n_cuts decode-time calls of update_kv (steps k with (prompt + k - 1) % 128 == 0)."""
    return ((1 - prompt) % DIVIDE_LENGTH or DIVIDE_LENGTH) + DIVIDE_LENGTH * (n_cuts - 1)


# Decode loops: prompt_len, budget, (heads, kv heads, head_dim), prompt regime, near-copies among decoded keys.
# Loop 6's prompt is shorter than its budget, loop 8's a multiple of divide_length (its first cut is at step 1).
LOOPS = (
    (150, 128, (4, 2, 32), "gaussian+duplicated", True),
    (180, 128, (4, 2, 32), "spiky+heavy", False),
    (600, 256, (8, 2, 64), "gaussian", True),
    (700, 192, (4, 4, 32), "duplicated", False),
    (300, 192, (8, 4, 64), "spiky", True),
    (450, 256, (4, 2, 128), "heavy", False),
    (200, 256, (8, 2, 32), "heavy+duplicated", True),
    (520, 192, (4, 2, 64), "spiky+duplicated", False),
    (256, 128, (8, 4, 32), "gaussian", False),
    (333, 192, (4, 2, 32), "heavy", True),
)


def rkv_loop_case(r1kv: type, i: int, tensors: dict) -> dict:
    seed, (prompt, budget, shape, regime, copies) = 40_000 + i, LOOPS[i % len(LOOPS)]
    g, s = torch.Generator().manual_seed(seed), Shape(*shape)
    steps = steps_for_cuts(prompt, 4 if prompt >= budget else 5) + 3  # the prefill and 4 cuts, or 5 cuts
    total = prompt + steps
    q, k = make_qk(g, regime, s, total, total)
    if copies:  # a tenth of the decoded tokens' keys are near-copies of earlier keys
        for pos in torch.randperm(steps, generator=g)[: steps // 10].add(prompt).tolist():
            src = int(torch.randint(0, pos, (1,), generator=g))
            k[:, :, pos] = k[:, :, src] + 1e-3 * randn(g, 1, s.kv_heads, s.head_dim)
    values = rkv_values(g, s, total)
    cuts, idle = rkv_loop(r1kv, q, k, values, prompt, steps, budget)
    name = f"rkv_loop_{i:02d}"
    tensors |= {f"{name}.queries": q, f"{name}.keys": k, f"{name}.values": values}
    tensors |= {f"{name}.cut{c}.kept": kept for c, (_, _, kept) in enumerate(cuts)}
    return {
        "name": name,
        "seed": seed,
        "regime": regime,
        "decoded_near_copies": copies,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "prompt_len": prompt,
        "steps": steps,
        "total": total,
        "budget": budget,
        **RKV,
        "divide_method": "step_length",
        "divide_length": DIVIDE_LENGTH,
        "cut_steps": [c[0] for c in cuts],
        "cut_cache_lens": [c[1] for c in cuts],
        "update_kv_steps_without_cut": idle,
    }


FAMILIES = ("defensivekv", "layer_defensivekv", "rkv_select", "rkv_loop")
SUBSET_BYTES = {"defensivekv": 600_000, "layer_defensivekv": 800_000, "rkv_select": 400_000, "rkv_loop": 1_400_000}


def case_bytes(tensors: dict, name: str) -> int:
    return sum(t.numel() * t.element_size() for key, t in tensors.items() if key.split(".", 1)[0] == name)


def tags(case: dict) -> set[str]:
    """What a subset must cover: every input regime, a Layer-DefensiveKV case that loses part of a window and one
    that does not, an R-KV selection on exactly `budget` tokens (nothing evicted, only reordered)."""
    out = set(case["regime"].split("+")) if isinstance(case["regime"], str) else set(case["regime"])
    if "window_kept_per_layer" in case:
        full = case["num_key_value_heads"] * case["window_size"]
        out.add("window lost" if min(case["window_kept_per_layer"]) < full else "windows kept")
    if "budget" in case and case["budget"] == case.get("seq_len"):
        out.add("seq_len == budget")
    return out


def subset(cases: list[dict], tensors: dict, family: str) -> list[dict]:
    """The smallest cases covering every tag, then the smallest others up to a third, within the byte budget; cases
    with equal scores at a top-k cut-off (kept positions then depend on torch.topk's choice) come last."""
    tie = {
        c["name"]: any([c.get("tie_at_cutoff"), c.get("tie_at_global_cutoff"), *c.get("tie_at_layer_cutoff", [])])
        for c in cases
    }
    by_size = sorted(cases, key=lambda c: (tie[c["name"]], case_bytes(tensors, c["name"])))
    chosen, covered = [], set()
    for case in by_size:
        if tags(case) - covered:
            covered |= tags(case)
            chosen.append(case)
    for case in by_size:
        total = sum(case_bytes(tensors, c["name"]) for c in chosen)
        if len(chosen) * 3 >= len(cases) or total + case_bytes(tensors, case["name"]) > SUBSET_BYTES[family]:
            break
        if case not in chosen:
            chosen.append(case)
    return sorted(chosen, key=lambda c: c["name"])


def write(folder: Path, family: str, cases: list[dict], tensors: dict, full_count: int | None) -> None:
    src, names = SOURCES["rkv" if family.startswith("rkv") else "defensivekv"], {c["name"] for c in cases}
    index = {
        "source": {"repository": src["repository"], "commit": src["commit"], "files": list(src["files"])},
        "recorded_by": "scripts/record_rival_cases.py",
        "notes": NOTES[family],
        "torch": torch.__version__,  # which of several equal scores torch.topk keeps (see tie_at_*) may depend on it
    }
    index |= {"decode_step": STEP_DEFINITION} if family == "rkv_loop" else {}
    index |= {"subset_of": f"{len(cases)} of the full set's {full_count} cases"} if full_count else {}
    index["cases"] = cases
    folder.mkdir(parents=True, exist_ok=True)
    kept = {k: t.contiguous() for k, t in tensors.items() if k.split(".", 1)[0] in names}
    save_file(kept, str(folder / f"rivals_{family}.safetensors"))
    (folder / f"rivals_{family}.json").write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--defensivekv", type=Path, required=True, help="checkout of FFY0/DefensiveKV")
    parser.add_argument("--rkv", type=Path, required=True, help="checkout of Zefan-Cai/R-KV")
    parser.add_argument("--out", type=Path, required=True, help="folder for the full set")
    parser.add_argument("--subset-out", type=Path, help="folder for the subset (e.g. tests/golden)")
    parser.add_argument("--counts", type=int, nargs=4, default=[30, 20, 40, 10], metavar="N", help=" ".join(FAMILIES))
    args = parser.parse_args()
    if min(args.counts) < 1:
        raise SystemExit(f"--counts {args.counts}: every count must be at least 1")
    for which in ("defensivekv", "rkv"):
        check_tree(getattr(args, which), which)
    torch.set_num_threads(1)
    dkv, r1kv = load_defensivekv(args.defensivekv), load_rkv(args.rkv)
    makers = (partial(dkv_case, dkv, False), partial(dkv_case, dkv, True), partial(rkv_select_case, r1kv))
    makers = dict(zip(FAMILIES, (*makers, partial(rkv_loop_case, r1kv)), strict=True))
    for family, count in zip(FAMILIES, args.counts, strict=True):
        tensors: dict[str, torch.Tensor] = {}
        cases = [makers[family](i, tensors) for i in range(count)]
        write(args.out, family, cases, tensors, None)
        line = f"{family}: {len(cases)} cases -> {args.out}"
        if args.subset_out is not None:
            part = subset(cases, tensors, family)
            write(args.subset_out, family, part, tensors, len(cases))
            line += f"; {len(part)} -> {args.subset_out}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
