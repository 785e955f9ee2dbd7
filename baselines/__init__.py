"""Baseline eviction policies, one per module; importing the package registers them all.

Every module of the package is imported, so a new policy is one file here (plus its config):
its ``@register_policy`` runs when the registry loads this package (the ``restkv.policies`` entry
point).
"""

import importlib
import pkgutil

from baselines.adakv import AdaKV
from baselines.cam import CAM
from baselines.criticalkv import CriticalKV
from baselines.full import FullCache
from baselines.h2o import H2O
from baselines.headkv import HeadKV
from baselines.l2norm import KNorm, L2Norm
from baselines.pyramidkv import PyramidKV
from baselines.random import RandomEviction
from baselines.snapkv import SnapKV
from baselines.streamingllm import StreamingLLM
from baselines.tova import TOVA

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "CAM",
    "H2O",
    "TOVA",
    "AdaKV",
    "CriticalKV",
    "FullCache",
    "HeadKV",
    "KNorm",
    "L2Norm",
    "PyramidKV",
    "RandomEviction",
    "SnapKV",
    "StreamingLLM",
]
