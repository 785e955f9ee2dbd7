"""One run, from its config to its folder: what ``eval/run.py`` does.

`config_tree` (the Hydra configs and the policy knobs as typed nodes) -> `validate` (every key checked
before anything is loaded) -> `runner` (plan, evaluate every missing sample, write metrics) with
`identity` (what makes a folder one experiment) and `run_folder` (naming, the lock, the resumable
predictions log, ``metrics.json``); `gpu_slots` gives each worker of a parallel sweep its GPU and
`tracking` copies a finished run to an experiment tracker.
"""
