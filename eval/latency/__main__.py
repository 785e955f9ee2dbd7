"""``python -m restkv.eval.latency latency=<preset> [overrides]`` (in a checkout also ``python -m eval.latency``)."""

from restkv.eval.latency.cli import main

if __name__ == "__main__":
    main()
