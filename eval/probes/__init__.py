"""Probes of a model that produce inputs for policies: HeadKV's retrieval-head scores (`retrieval_heads`)."""
