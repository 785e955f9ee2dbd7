"""The harness (installed as ``restkv.eval``; the ``eval/`` folder of a checkout), as a pipeline.

- `harness`: one run from its config to its folder (``eval/run.py`` is its entry point);
- `benchmarks`: datasets as `Sample`s, each benchmark with its prompts and metrics, one metric registry;
- `evaluation`: how a sample is evaluated (answer then score, or divergence from the full cache),
  with prompting and the decoding loop it drives;
- `models`: the model a run names, loaded, placed and fingerprinted, and where the project's files are;
- `latency`: the efficiency benchmark (``python -m eval.latency``);
- `report`: finished runs read back as one table, with intervals, and every paper artifact drawn from it;
- `probes`: model probes that produce policy inputs (HeadKV's retrieval-head scores).
"""
