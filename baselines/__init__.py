"""Baseline eviction policies, one per module; importing the package registers them all.

Every module of the package is imported, so a new policy is one file here (plus its config):
its ``@register_policy`` runs when the registry loads this package (the ``restkv.policies`` entry
point).
"""

import importlib
import pkgutil

from restkv.baselines.adakv import AdaKV
from restkv.baselines.cam import CAM
from restkv.baselines.caote import CAOTE
from restkv.baselines.criticalkv import CriticalKV
from restkv.baselines.defensivekv import DefensiveKV
from restkv.baselines.full_cache import FullCache
from restkv.baselines.h2o import H2O
from restkv.baselines.headkv import HeadKV
from restkv.baselines.knorm import KNorm
from restkv.baselines.kvzip import KVzip
from restkv.baselines.l2norm import L2Norm
from restkv.baselines.pyramidkv import PyramidKV
from restkv.baselines.random_eviction import RandomEviction
from restkv.baselines.rkv import RKV
from restkv.baselines.snapkv import SnapKV
from restkv.baselines.streamingllm import StreamingLLM
from restkv.baselines.tova import TOVA

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "CAM",
    "CAOTE",
    "H2O",
    "RKV",
    "TOVA",
    "AdaKV",
    "CriticalKV",
    "DefensiveKV",
    "FullCache",
    "HeadKV",
    "KNorm",
    "KVzip",
    "L2Norm",
    "PyramidKV",
    "RandomEviction",
    "SnapKV",
    "StreamingLLM",
]
