"""Import the DefensiveKV and R-KV authors' selection code from their checkouts, checked file by file against the
commit it was recorded at, without touching an installed `kvpress` or `rkv` (used by `record_rival_cases.py`)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sys
import types
from pathlib import Path

SOURCES = {
    "defensivekv": {
        "repository": "FFY0/DefensiveKV",
        "commit": "9251b95e7e282a6c18dd98ef6318dd489e639a58",
        "files": {
            "kvpress/ada_cache.py": "b56d8962e942be5fc3d979c6ea1eafb822e7db56",
            "kvpress/presses/base_press.py": "20cd98c2444e4d8380dff97c64222b576ec90b3b",
            "kvpress/presses/scorer_press.py": "eb249c9cee227e84c04a17a36b260cffac403460",
            "kvpress/presses/efficient_ada_scorer_press.py": "eea1211ebce4e8025ea2a6b2b7e9f55f60071ef6",
            "kvpress/presses/efficient_ada_global_scorer_press.py": "ea80be454fe613cd0f21c6e52ef61547b25579c1",
            "kvpress/presses/efficient_defensivekv_press.py": "0071610b6c74022e24f6bb8b9d7d4cb8a3c15336",
            "kvpress/presses/efficient_layer_defensivekv_press.py": "2827daaa8a274bbbc81ea11e6e3e380b11b0102f",
        },
    },
    "rkv": {
        "repository": "Zefan-Cai/R-KV",
        "commit": "d15c9767e67c2bd9807128fecc35223fa2484a69",
        "files": {
            "rkv/utils.py": "43c06252fcfecc98bba46ca7cb5615437ae9ce72",
            "rkv/compression/r1_kv.py": "a4f75877f81dab49253f2369d32d281b791b4841",
            "rkv/modeling.py": "c354bddc6152821bad6392086814cd30d46ce826",
            "run_math.py": "fed8353109f5e86b5a45c55b93ed286e4b815547",
        },
    },
}
"""The authors' repositories, the commits recorded, and the git blob hash of each file read at that commit."""


def blob_hash(path: Path) -> str:
    """Git's blob id of a file (sha1 of ``blob <size>\\0<content>``): checks an exported tree without git."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_tree(root: Path, which: str) -> None:
    """Refuse a checkout whose files differ from the recorded commit's."""
    for rel, expected in SOURCES[which]["files"].items():
        path = root / rel
        if not path.is_file():
            raise SystemExit(f"--{which} {root}: no file {rel}; give a checkout of {SOURCES[which]['repository']}")
        if blob_hash(path) != expected:
            raise SystemExit(f"{path}: blob {blob_hash(path)} is not {expected} (commit {SOURCES[which]['commit']})")


@contextlib.contextmanager
def stub_packages(prefix: str, names: tuple[str, ...]):
    """Empty packages ``names`` (all under ``prefix``) in sys.modules while the authors' files import; afterwards
    the previous entries are restored, so an installed `kvpress` or `rkv` is untouched."""
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n == prefix or n.startswith(prefix + ".")}
    stubs = {n: types.ModuleType(n) for n in names}
    for mod in stubs.values():
        mod.__path__ = []  # a package whose submodules are loaded by hand
    sys.modules.update(stubs)
    try:
        yield stubs
    finally:
        for name in [n for n in sys.modules if n == prefix or n.startswith(prefix + ".")]:
            del sys.modules[name]
        sys.modules.update(saved)


def load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    sys.modules[name] = mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def no_triton(*_args, **_kwargs):
    raise NotImplementedError("the triton kernel is not run here: the press's own vwl1norm replaces it")


def load_defensivekv(root: Path) -> dict:
    """Their cache class and both presses, imported from ``root`` with `kvpress.ops.vw_norm` stubbed."""
    with stub_packages("kvpress", ("kvpress", "kvpress.presses", "kvpress.ops", "kvpress.ops.vw_norm")) as stubs:
        stubs["kvpress.ops.vw_norm"].vw_l1norm = no_triton
        mods = {rel: load(rel[:-3].replace("/", "."), root / rel) for rel in SOURCES["defensivekv"]["files"]}
    return {
        "cache": mods["kvpress/ada_cache.py"].DynamicCacheSplitHeadFlatten,
        "one": mods["kvpress/presses/efficient_defensivekv_press.py"].EfficientDefensiveKVPress,
        "layer": mods["kvpress/presses/efficient_layer_defensivekv_press.py"].EfficientLayerDefensiveKVPress,
    }


def load_rkv(root: Path) -> type:
    """Their `R1KV` class, imported from ``root`` (their `rkv/compression/__init__.py` imports modules absent at
    this commit, so the package is a stub carrying the two helpers it re-exports from `rkv/utils.py`)."""
    with stub_packages("rkv", ("rkv", "rkv.compression")) as stubs:
        utils = load("rkv.utils", root / "rkv/utils.py")
        stubs["rkv.compression"].cal_similarity = utils.cal_similarity
        stubs["rkv.compression"].compute_attention_scores = utils.compute_attention_scores
        return load("rkv.compression.r1_kv", root / "rkv/compression/r1_kv.py").R1KV
