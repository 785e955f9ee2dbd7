"""``python -m restkv.eval.latency latency=<preset> [overrides]``: the efficiency benchmark's entry point.

The command line is checked first, every job of it (`restkv.eval.latency.preflight`); ``--check`` stops there."""

import sys

from restkv.eval.harness.interrupts import quiet_interrupts

if __name__ == "__main__":
    quiet_interrupts()  # first: Ctrl-C while torch imports is one line too
    from restkv.eval.latency.preflight import check_before_hydra

    sys.argv[1:] = check_before_hydra(sys.argv[1:])
    from restkv.eval.latency.cli import main

    main()
