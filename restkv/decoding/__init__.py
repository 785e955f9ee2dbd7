"""Decoding after eviction: how greedy answers are computed once the prompt's cache is compressed.

- `restkv.decoding.eviction`: eviction *during* decoding (``compression.phase=decode|both``): each layer cut back
  to a budget every few generated tokens, and what cannot be cut (`check_decode_eviction`).
- `restkv.decoding.static_layers`: static-shape cache layers (fixed buffers, per-head lengths on the device) and
  the attention over them, so that a decode step can be recorded once.
- `restkv.decoding.static_decoder`: the decode step run over those layers, eagerly or recorded as a CUDA graph and
  replayed (``decode=static|graph|auto``), with its decoders kept per shape.
- `restkv.decoding.rows`: many prompts per decode step (``decode_batch``), each prompt a row of a static decoder.
- `restkv.decoding.cpu_attention`: the attention of one new token over the cache on CPUs, as two GEMMs per
  key/value head (``decode_kernel=gemm``).

Which of these a run uses is decided in one place, `restkv.eval.harness.decode_plan` (docs/adding-a-decode-path.md).
"""
