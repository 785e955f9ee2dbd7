"""A new policy is one small file: keep the past tokens whose keys have the smallest norm.

Put it in ``baselines/`` (every module there registers when the registry loads) with a config
``configs/policy/keynorm.yaml``, then ``python eval/run.py policy=keynorm policy.window=64``. Run as a
script (``python docs/examples/keynorm_policy.py``) it evicts with it on the micro model.
"""

from dataclasses import dataclass

import torch

from restkv import LayerInputs, Policy, register_policy


@register_policy("keynorm")
@dataclass
class KeyNorm(Policy):
    """Keep the keys with the smallest norm (plus the window, which every policy keeps)."""

    def score(self, inputs: LayerInputs, keep: int) -> torch.Tensor:
        past = inputs.length - self.window
        scores = -inputs.keys[:, :, :past].float().norm(dim=-1)  # [batch, kv heads, past tokens]
        return scores.repeat_interleave(inputs.num_heads // inputs.num_kv_heads, dim=1)  # one row per query head


if __name__ == "__main__":
    from transformers import AutoModelForCausalLM

    from restkv import compress, get_policy

    model = AutoModelForCausalLM.from_pretrained("models/micro-llama")
    with compress(model, get_policy("keynorm", window=8), budget=40) as compressor:
        model.generate(torch.randint(0, 1000, (1, 100)), max_new_tokens=2, do_sample=False)
    print(f"each layer kept {compressor.record.kept} tokens of 100")
