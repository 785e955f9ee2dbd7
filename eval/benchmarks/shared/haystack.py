"""Background text ("haystacks") for the long-context retrieval benchmarks.

Two public-domain novels ship with the repository under ``eval/benchmarks/data/haystack/`` (provenance in
``SOURCES.md`` there):

* ``austen_emma`` — *Emma* (1815), the **evaluation** haystack and the default everywhere a
  haystack is needed (RULER's essay tasks, Needle-in-a-Haystack).
* ``austen_pride_and_prejudice`` — *Pride and Prejudice* (1813), reserved for **training** small
  models, so that evaluation never runs on text a test model was trained on.

The published benchmarks use Paul Graham's essays instead, which cannot be redistributed; a
folder of them (one ``.txt`` per essay, as the original Needle-in-a-Haystack and RULER scripts
use) can be passed wherever a haystack source is accepted.
"""

from __future__ import annotations

from pathlib import Path

from restkv.eval.benchmarks.contract.reads import note

HAYSTACK_DIR = Path(__file__).resolve().parents[1] / "data" / "haystack"

EVAL_HAYSTACK = "austen_emma"
TRAIN_HAYSTACK = "austen_pride_and_prejudice"

BUNDLED: dict[str, str] = {
    EVAL_HAYSTACK: "eval_austen_emma.txt",
    TRAIN_HAYSTACK: "train_austen_pride_and_prejudice.txt",
}
"""Bundled haystack name -> file name under :data:`HAYSTACK_DIR`."""

ALIASES: dict[str, str] = {"eval": EVAL_HAYSTACK, "train": TRAIN_HAYSTACK}

_HOW_TO_GET_ESSAYS = (
    "To use Paul Graham's essays (the haystack of the original benchmarks), run "
    "`python scripts/download_data.py paul_graham` and pass the folder it creates; "
    f"or pass one of the bundled haystacks: {', '.join(sorted(BUNDLED))} (aliases: "
    f"{', '.join(f'{k}={v}' for k, v in sorted(ALIASES.items()))})."
)


def bundled_path(name: str) -> Path:
    """Path of a bundled haystack, by name or alias (``"eval"``, ``"train"``)."""
    key = ALIASES.get(name, name)
    if key not in BUNDLED:
        raise KeyError(f"unknown bundled haystack {name!r}; known: {sorted(BUNDLED)}")
    return HAYSTACK_DIR / BUNDLED[key]


def haystack_name(source: str | Path | None) -> str:
    """A short label for ``source`` to record in sample metadata."""
    if source is None:
        return EVAL_HAYSTACK
    if isinstance(source, str) and ALIASES.get(source, source) in BUNDLED:
        return ALIASES.get(source, source)
    return str(source)


def load_haystack(source: str | Path | None = None) -> str:
    """Return the haystack text named by ``source``.

    ``source`` may be:

    * ``None`` — the bundled evaluation text (:data:`EVAL_HAYSTACK`);
    * a bundled name or alias (see :data:`BUNDLED`, :data:`ALIASES`);
    * a directory — every ``*.txt`` file in it, concatenated in sorted file-name order (the
      layout of the Paul Graham essays folder);
    * a single text file.

    Raises :class:`FileNotFoundError` when the path does not exist or a directory holds no
    ``.txt`` file; the message says how to obtain the Paul Graham essays.
    """
    if source is None:
        note(bundled_path(EVAL_HAYSTACK))
        return bundled_path(EVAL_HAYSTACK).read_text(encoding="utf-8")
    if isinstance(source, str) and ALIASES.get(source, source) in BUNDLED:
        note(bundled_path(source))
        return bundled_path(source).read_text(encoding="utf-8")

    path = Path(source).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.glob("*.txt") if p.is_file())
        if not files:
            raise FileNotFoundError(f"haystack folder {path} contains no .txt files. {_HOW_TO_GET_ESSAYS}")
        parts: list[str] = []
        for file in files:
            note(file)
            text = file.read_text(encoding="utf-8", errors="replace")
            # Keep neighbouring documents from gluing their last and first words together.
            if parts and parts[-1] and not parts[-1][-1].isspace():
                parts.append("\n")
            parts.append(text)
        return "".join(parts)
    if path.is_file():
        note(path)
        return path.read_text(encoding="utf-8", errors="replace")
    raise FileNotFoundError(f"haystack source {path} does not exist. {_HOW_TO_GET_ESSAYS}")


def check_haystack(source: str | Path | None, key: str = "bench.haystack") -> None:
    """Fail now, naming ``key``, when ``source`` names no haystack (rather than when a task first reads it)."""
    if source is None or (isinstance(source, str) and ALIASES.get(source, source) in BUNDLED):
        return
    path = Path(source).expanduser()
    if path.is_file() or (path.is_dir() and any(p.is_file() for p in path.glob("*.txt"))):
        return
    problem = "is a folder with no .txt file" if path.is_dir() else "does not exist"
    raise ValueError(f"{key}={str(source)!r} {problem}. {_HOW_TO_GET_ESSAYS}")
