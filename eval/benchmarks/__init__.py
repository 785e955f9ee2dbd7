"""Benchmarks: each turns a dataset (generated or loaded) into `Sample`s plus a scorer.

One module or subpackage per benchmark, its prompts and metrics beside it (`ruler`, `longbench`,
`infinitebench`, `niah`, `micro`, `fidelity`); `metrics` is the one registry of metric names; `base`
the `Benchmark` protocol and `sample` the `Sample` every benchmark yields; `jsonl`, `official` and
`haystack` are what several loaders share. Bundled texts and word lists are in ``data/``.
"""
