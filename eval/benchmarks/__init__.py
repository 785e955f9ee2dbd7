"""Benchmarks: each turns a dataset (generated or loaded) into `Sample`s plus a scorer.

Every benchmark is a subpackage holding its loader, prompts, metrics and data sources (`ruler`, `longbench`,
`infinitebench`, `niah`, `micro`, `math`, `scbench`, `fidelity`); nothing lists them, they are found by folder
(`restkv.eval.benchmarks.contract.packages`). `contract` is what the runner and every benchmark agree on (the
`Benchmark` protocol, the `Sample`, the metric registry, the record of files read); `shared` holds what several
loaders share (JSON-lines files, record checks, haystacks, text metrics, downloads). Bundled texts and word lists
are in ``data/``.
"""
