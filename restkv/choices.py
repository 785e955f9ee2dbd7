"""The names a user can choose among for the library's settings, kept free of torch so that a command line is
checked against them before any heavy import (the modules that implement each choice import them from here)."""

from __future__ import annotations

LAYOUTS = ("auto", "varlen", "masked")
"""How kept tokens are stored (`restkv.storage.layouts`)."""
DECODE_PATHS = ("auto", "eager", "static", "graph")
"""How greedy answers are decoded (`restkv.decoding.static_decoder`): ``eager``, the model's own loop; ``static``,
the static-shape step run eagerly; ``graph``, that step recorded once as a CUDA graph and replayed; ``auto``,
``graph`` on CUDA where the cache has a static form, else ``eager``."""
PROTOCOLS = ("query_aware", "query_agnostic")
"""Where the question goes: inside the compressed prompt (the paper's protocol), or after eviction."""
PHASES = ("prefill", "decode", "both")
"""When eviction happens (`restkv.decoding.eviction`): at the end of the prompt, during decoding, or both."""
DECODE_SCHEDULES = ("interval", "length")
"""When a layer is due for a decode-time cut: ``interval`` (every ``interval`` decoded tokens since its last cut, or
when it outgrows ``budget + interval``) or ``length`` (R-KV's authors' loop: on the decoding step after the one at
which the sequence, prompt included, reached a multiple of ``interval`` tokens; their ``divide_length`` is 128)."""
DECODE_INTERVAL = 32
"""Decoded tokens between two decode-time cuts unless set (`restkv.decoding.eviction.DecodeEviction.interval`, the
run-level ``compression.decode_interval``): the one place the default is written."""
GQA_MODES = ("mean", "max", "expand")
"""How a grouped-query model's per-query-head scores become one selection per key/value head (`restkv.select`)."""
QUANT_BACKEND_MODULES = {"hqq": "hqq", "quanto": "optimum.quanto", "kvquant": "hqq"}
"""The module each quantization backend imports (`restkv.storage.quantize`)."""
QUANT_BACKEND_PACKAGES = {"hqq": "hqq", "quanto": "optimum-quanto", "kvquant": "hqq"}
"""The package that provides it, as pip names it."""
