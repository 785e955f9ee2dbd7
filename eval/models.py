"""Loading the model and tokenizer a config names: a hub id or a local folder, as users run it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from eval.paths import local_path
from restkv.devices import torch_dtype


@dataclass
class ModelSpec:
    """The ``model`` config group.

    path: hub id (``meta-llama/Llama-3.1-8B-Instruct``) or local folder; relative folders are
      looked up from the working directory, then from the repository root.
    tokenizer: where the tokenizer lives when not beside the weights.
    max_context: prompts longer than this are cut in the middle (first and last halves kept).
    chat_template: wrap prompts in the tokenizer's chat template (benchmarks may opt out per task).
    random_init: build the architecture from ``config.json`` with random weights (no weights
      needed: smoke tests, latency).
    """

    name: str
    path: str
    dtype: str = "bfloat16"
    attn_implementation: str = "sdpa"
    max_context: int = 131072
    chat_template: bool = True
    tokenizer: str | None = None
    random_init: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        torch_dtype(self.dtype, "model.dtype")
        if self.max_context < 1:
            raise ValueError(f"model.max_context={self.max_context} must be >= 1")


def resolve(path: str) -> str:
    """A local folder if one exists under that name (cwd, then the project); else the hub id unchanged."""
    local = local_path(path)
    return str(local) if local is not None else path


WEIGHT_FILES = ("*.safetensors", "*.bin", "config.json", "tokenizer.json")
SAMPLED_BYTES = 1 << 20


def weights_fingerprint(spec: ModelSpec) -> str | None:
    """A short hash that changes when a local model folder's weights change (None for hub ids).

    Run folders are named after the config, not the weights: a model retrained in place would
    otherwise have its old predictions resumed as if they were its own. Sizes plus the first and
    last MiB of each file keep this instant for multi-GB checkpoints.
    """
    folder = Path(resolve(spec.path))
    if not folder.is_dir():
        return None
    digest = hashlib.sha256(f"random_init={spec.random_init} seed={spec.seed}".encode())
    files = sorted({f for pattern in WEIGHT_FILES for f in folder.glob(pattern) if f.is_file()})
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(SAMPLED_BYTES))
            handle.seek(max(size - SAMPLED_BYTES, 0))
            digest.update(handle.read(SAMPLED_BYTES))
    return digest.hexdigest()[:16]


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(resolve(spec.tokenizer or spec.path))


def load_model(spec: ModelSpec, device: torch.device) -> PreTrainedModel:
    """The model in eval mode on ``device`` with the configured dtype and attention backend."""
    source = resolve(spec.path)
    dtype = torch_dtype(spec.dtype, "model.dtype")
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": spec.attn_implementation}
    if spec.random_init:
        config = AutoConfig.from_pretrained(source)
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    return model.to(device).eval()


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every token that ends an answer: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
