"""Efficiency benchmark: prefill with eviction, eviction alone, decoding, peak memory, against their limits.

    python -m restkv.eval.latency latency=tiny                  # every code path in seconds (CI)
    python -m restkv.eval.latency latency=cpu-8k                # prefill overhead / memory, ReST-KV vs SnapKV
    python -m restkv.eval.latency latency=cpu-decode-32k        # decoding vs the bandwidth bound
    python -m restkv.eval.latency latency=gpu-h200              # scripts/efficiency_gpu.sh
    python -m restkv.eval.latency latency=cpu-scoring           # one 8B layer's eviction decision, ReST-KV vs SnapKV
    python -m restkv.eval.latency latency=cpu-8k latency.contexts=[4096] latency.repeats=5   # any field overridden

Two modes (``mode`` in the preset): ``model`` runs a whole random-weight model of a real shape
(`runner`, `jobs`); ``scoring`` times one layer's eviction decision alone (`scoring`). Presets
live in ``configs/latency/`` (fields documented in ``base.yaml``), model shapes in
``configs/shapes/`` (real models' ``config.json``; random weights, nothing downloaded), policies
in ``configs/policy/``. Writes ``<out_dir>/<preset>.json`` and ``-latency.png``/``-memory.png``.
"""
