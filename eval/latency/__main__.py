"""``python -m eval.latency latency=<preset> [overrides]`` (also ``python eval/latency ...``)."""

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a folder: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from eval.latency.cli import main

if __name__ == "__main__":
    main()
