"""Where the project's own files are: the Hydra configs, the bundled models, relative data paths.

Run from a source checkout (plain or editable install) they are the checkout's folders. From a
regular install (``pip install .``) the configs and the bundled models (``models/micro-llama``,
``models/tiny-random-llama``) are installed as package data under ``eval/assets/``, and relative
paths (``data/...``, ``results/...``) are taken from the working directory.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT: Path | None = _ROOT if (_ROOT / "pyproject.toml").is_file() and (_ROOT / "configs").is_dir() else None
"""The source checkout this code runs from, or None for a regular install."""
BUNDLED = ("configs", "models")


def project_root() -> Path:
    """What relative data and result paths are relative to: the checkout, else the working directory."""
    return CHECKOUT if CHECKOUT is not None else Path.cwd()


def bundled(folder: str) -> Path:
    """The project's ``configs`` or ``models`` folder: the checkout's, else the installed copy."""
    if folder not in BUNDLED:
        raise ValueError(f"bundled folder {folder!r} is not one of: {', '.join(BUNDLED)}")
    if CHECKOUT is not None:
        return CHECKOUT / folder
    spec = importlib.util.find_spec(f"restkv.eval.assets.{folder}")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"restkv's {folder}/ folder is neither in a source checkout nor installed with the package; "
            "reinstall it (pip install . from the repository, or pip install -e . for a checkout)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def local_path(given: str | Path) -> Path | None:
    """``given`` as an existing local file or folder: as written, then under the project; None if neither.

    A path under ``configs/`` or ``models/`` also finds the installed copy of the bundled folder.
    """
    candidates = [Path(given).expanduser()]
    if CHECKOUT is not None:
        candidates.append(CHECKOUT / given)
    else:
        first, *rest = Path(given).parts or ("",)
        if first in BUNDLED and rest:
            candidates.append(bundled(first).joinpath(*rest))
    return next((path for path in candidates if path.exists()), None)
