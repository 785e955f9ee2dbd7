"""Loading the model and tokenizer a config names: a hub id or a local folder, as users run it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from restkv.devices import torch_dtype
from restkv.eval.models.hub import cached_model, hub_reachable
from restkv.eval.models.paths import local_path
from restkv.eval.models.placement import DEVICE_MAPS, check_device_map, dispatched
from restkv.eval.models.spec import ModelSpec

if TYPE_CHECKING:  # transformers is imported when a model is loaded, not to check or fingerprint one
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def resolve(path: str) -> str:
    """A local folder if one exists under that name (cwd, then the project); else the hub id unchanged, or, when the
    hub cannot be reached, its snapshot in the local hub cache (read without a single retry over the network)."""
    local = local_path(path)
    if local is not None:
        return str(local)
    if not hub_reachable():
        cached = cached_model(path)
        if cached is not None:
            return str(cached)
    return path


def local_config(spec: ModelSpec) -> Any:
    """The model's config when its folder is local (no download; what checks before loading read), else None."""
    folder = local_path(spec.path)
    if folder is None or not (folder / "config.json").is_file():
        return None
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(folder)


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The tokenizer of ``model.tokenizer`` when given, else the one beside the weights."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve(spec.tokenizer or spec.path))


def load_model(spec: ModelSpec, device: torch.device) -> PreTrainedModel:
    """The model in eval mode with the configured dtype and attention backend, placed straight on its devices.

    Weights load directly onto ``device`` (or, with ``model.device_map=auto``, onto every visible
    GPU, layer by layer), never all through host memory first; random weights are built there.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    check_device_map(spec.device_map, device)
    source = resolve(spec.path)
    dtype = torch_dtype(spec.dtype, "model.dtype")
    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": spec.attn_implementation}
    placement = spec.device_map if spec.device_map is not None else str(device)
    if not spec.random_init:
        model = AutoModelForCausalLM.from_pretrained(source, device_map=placement, **kwargs)
        return model.eval()
    config = AutoConfig.from_pretrained(source)
    torch.manual_seed(spec.seed)
    if spec.device_map in DEVICE_MAPS:
        return dispatched(AutoModelForCausalLM.from_config(config, **kwargs), spec.device_map).eval()
    with torch.device(placement):
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model.eval()


def eos_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """Every token that ends an answer: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids
