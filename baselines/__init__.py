"""Baseline eviction policies, one per module; importing the package registers them all.

Every module of the package is imported, so a new policy is one file here (plus its config): its
``@register_policy`` runs when the registry loads this package (the ``restkv.policies`` entry point), and every
policy class a module defines is exported here under its own name (``from restkv.baselines import SnapKV``), so
this file never changes when a policy is added.
"""

import importlib
import inspect
import pkgutil

from restkv.policy import Policy

__all__: list[str] = []

for _module in pkgutil.iter_modules(__path__):
    _loaded = importlib.import_module(f"{__name__}.{_module.name}")
    for _name, _value in vars(_loaded).items():
        defined_here = inspect.isclass(_value) and _value.__module__ == _loaded.__name__
        if defined_here and issubclass(_value, Policy) and not _name.startswith("_"):
            globals()[_name] = _value
            __all__.append(_name)
__all__.sort()
