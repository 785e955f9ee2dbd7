"""Evict with ReST-KV at the end of prefill, then generate: restkv's Python API in a few lines.

Runs as is from a checkout (``python docs/examples/quickstart.py``, about 5 s on a CPU) on the
bundled micro model; any Llama / Mistral / Qwen2 / Qwen3 causal LM of transformers works the same.
"""

from transformers import AutoModelForCausalLM, AutoTokenizer

from restkv import ReSTKV, compress
from restkv.eval.benchmarks.micro import passkey_sample

model = AutoModelForCausalLM.from_pretrained("models/micro-llama")  # or a hub id: "meta-llama/Llama-3.1-8B-Instruct"
tokenizer = AutoTokenizer.from_pretrained("models/micro-llama")
sample = passkey_sample(tokenizer, context_length=2048, seed=0)  # a pass key hidden in 2,048 tokens of noise
inputs = tokenizer(sample.context + sample.question + sample.answer_prefix, return_tensors="pt")

with compress(model, ReSTKV(), budget=128) as compressor:  # every layer keeps 128 tokens of the prompt
    output = model.generate(**inputs, max_new_tokens=8, do_sample=False)

answer = tokenizer.decode(output[0, inputs.input_ids.shape[1] :], skip_special_tokens=True)
print(f"kept {compressor.record.kept[0]} of {inputs.input_ids.shape[1]} tokens per layer; answer: {answer.strip()!r}")
print(f"the pass key: {sample.references[0]!r}")
