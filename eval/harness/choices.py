"""The names a user can choose among for the harness's top-level settings, free of torch so that a command line is
checked against them before any heavy import."""

from __future__ import annotations

PROTOCOLS = ("query_aware", "query_agnostic")
"""Where the question goes: inside the compressed prompt (the paper's protocol), or after eviction."""
ON_CHANGE = ("refuse", "new_folder", "adopt")
"""What a run does when its folder holds another experiment (see `restkv.eval.harness.identity`)."""
