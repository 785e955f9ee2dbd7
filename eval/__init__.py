"""Evaluation harness: benchmarks, metrics, the Hydra runner and latency measurements."""
