"""Benchmarks: each module turns a dataset (generated or loaded) into `Sample`s plus a scorer."""
