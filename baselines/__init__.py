"""Baseline eviction policies, one per module; importing the package registers them all."""

from baselines.full import FullCache
from baselines.h2o import H2O
from baselines.pyramidkv import PyramidKV
from baselines.random import RandomEviction
from baselines.snapkv import SnapKV
from baselines.streamingllm import StreamingLLM

__all__ = ["H2O", "FullCache", "PyramidKV", "RandomEviction", "SnapKV", "StreamingLLM"]
