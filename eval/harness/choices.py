"""The names a user can choose among for the harness's top-level settings, free of torch so that a command line is
checked against them before any heavy import."""

from __future__ import annotations

from restkv.choices import PROTOCOLS as PROTOCOLS  # re-exported: the library's evaluation code names them too

ON_CHANGE = ("refuse", "new_folder", "adopt")
"""What a run does when its folder holds another experiment (see `restkv.eval.harness.identity`)."""
