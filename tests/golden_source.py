"""Which recorded eviction calls of the authors' code the parity tests replay.

``RESTKV_GOLDEN`` names a fixture folder (the full set: 41 selection and 23 head-wise cases); without it the tests
replay the subset that ships in ``tests/golden/`` (every configuration family once, `scripts/golden_subset.py`), and
the test session's header says so. A ``RESTKV_GOLDEN`` that names no fixture folder is an error, not a skip.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

BUNDLED = Path(__file__).resolve().parent / "golden"
FULL_COUNTS = {"official_selection": 41, "official_headwise": 23}
"""Cases in the authors' full recorded set, for the header's "n of N"."""


def golden_folder() -> Path:
    """``RESTKV_GOLDEN``, else the bundled subset; raises when ``RESTKV_GOLDEN`` holds no fixture files."""
    given = os.environ.get("RESTKV_GOLDEN", "").strip()
    if not given:
        return BUNDLED
    folder = Path(given).expanduser()
    if not any((folder / f"{stem}.json").is_file() for stem in FULL_COUNTS):
        raise FileNotFoundError(
            f"RESTKV_GOLDEN={given!r} holds no official_selection.json or official_headwise.json; point it at a "
            "fixture folder, or unset it to replay the bundled subset (tests/golden)"
        )
    return folder


def describe() -> str:
    """One line for the test session's header: which fixtures, how many cases, how to run the full set."""
    folder = golden_folder()
    counts = []
    for stem, full in FULL_COUNTS.items():
        path = folder / f"{stem}.json"
        cases = len(json.loads(path.read_text(encoding="utf-8"))["cases"]) if path.is_file() else 0
        counts.append(f"{cases}" + (f" of {full}" if folder == BUNDLED else "") + f" {stem.split('_')[1]}")
    if folder == BUNDLED:
        return (
            f"golden fixtures: the bundled subset (tests/golden: {', '.join(counts)} cases); set "
            "RESTKV_GOLDEN=<folder> to replay a full set"
        )
    return f"golden fixtures: RESTKV_GOLDEN={folder} ({', '.join(counts)} cases)"


def rival_folder() -> Path:
    """Where the rivals' recorded calls are (``rivals_<family>.json``): ``RESTKV_GOLDEN`` when it holds them (a full
    set made by ``scripts/record_rival_cases.py``), else the subset bundled in ``tests/golden``."""
    given = os.environ.get("RESTKV_GOLDEN", "").strip()
    if given and (Path(given).expanduser() / "rivals_defensivekv.json").is_file():
        return Path(given).expanduser()
    return BUNDLED
