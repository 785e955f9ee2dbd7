"""What every benchmark and the runner agree on: `base` (the `Benchmark` protocol), `sample` (the `Sample` a
benchmark yields), `metrics` (the registry of per-sample metrics, found in the benchmark packages), `reads` (the
data files a load reads, for a run's identity), `packages` (which benchmark packages there are) and `sources`
(the data sources they declare)."""
