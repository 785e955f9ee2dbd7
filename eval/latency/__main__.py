"""``python -m restkv.eval.latency latency=<preset> [overrides]``: the efficiency benchmark's entry point."""

from restkv.eval.latency.cli import main

if __name__ == "__main__":
    main()
