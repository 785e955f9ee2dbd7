"""What the chosen settings need beyond the core install, checked before any work: NLTK's punkt data for
``bench.sentences=punkt``, the flash-attention package, kvpress for ``policy=kvpress``, the quantization backends,
wandb for ``logger=wandb``, the joblib and submitit launcher plugins. A missing one is refused in one line naming
the install or the other setting, instead of a traceback once a model or a sweep is under way.

Nothing here imports the optional package itself (``find_spec`` only, NLTK's data looked up by NLTK), so a check
costs milliseconds; the run imports what it uses when it uses it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

LAUNCHER_PACKAGES = {
    "joblib": ("hydra_plugins.hydra_joblib_launcher", 'pip install -e ".[launchers]" (hydra-joblib-launcher)'),
    "slurm": ("hydra_plugins.hydra_submitit_launcher", 'pip install -e ".[slurm]" (hydra-submitit-launcher)'),
}
"""``hydra/launcher=<choice>``: the plugin's module and how to install it."""


POLICY_PACKAGES = {
    "restkv.interop.kvpress_policy.KVPressPolicy": ("kvpress", 'pip install -e ".[kvpress]" (kvpress==0.5.5)'),
}
"""Policies whose class needs a package beyond the core install: its module and how to install it."""


class MissingNeed(ValueError):
    """A setting needs a package or data that is not installed here; the message names the install or the
    other setting."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (a missing parent package counts as missing)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def bench_nodes(node: Any, key: str = "bench") -> Iterator[tuple[str, dict[str, Any]]]:
    """The benchmark node and those nested in it (``bench.source`` of ``bench=fidelity``), with their keys."""
    if isinstance(node, dict):
        yield key, node
        for name, value in node.items():
            if isinstance(value, dict) and "_target_" in value:
                yield from bench_nodes(value, f"{key}.{name}")


def check_punkt(values: dict[str, Any]) -> None:
    """``bench.sentences=punkt`` (RULER's essays split as the official generator does) needs NLTK's punkt data."""
    for key, node in bench_nodes(values.get("bench")):
        if node.get("sentences") == "punkt":
            from restkv.eval.benchmarks.ruler.haystacks import resolve_splitter

            try:
                resolve_splitter("punkt")
            except RuntimeError as error:
                raise MissingNeed(str(error).replace("bench.sentences", f"{key}.sentences")) from None


def check_quantization(values: dict[str, Any]) -> None:
    """``quantization=kivi|kvquant`` and ``quantization.backend=quanto`` need their packages."""
    from restkv.choices import QUANT_BACKEND_MODULES as BACKEND_MODULES
    from restkv.choices import QUANT_BACKEND_PACKAGES as BACKEND_PACKAGES

    backend = (values.get("quantization") or {}).get("backend", "none")
    module = BACKEND_MODULES.get(backend)
    if module is not None and not installed(module):
        raise MissingNeed(
            f"quantization.backend={backend} needs the {BACKEND_PACKAGES[backend]!r} package, which is not installed "
            f'here: pip install -e ".[quant]" (or pip install {BACKEND_PACKAGES[backend]}); or quantization=none'
        )


def check_flash(values: dict[str, Any]) -> None:
    """``model.attn_implementation=flash_attention_2`` needs the flash_attn package (a CUDA build)."""
    from restkv.eval.models.spec import FLASH_PACKAGES

    implementation = (values.get("model") or {}).get("attn_implementation")
    package = FLASH_PACKAGES.get(str(implementation))
    if package is not None and not installed(package):
        raise MissingNeed(
            f"model.attn_implementation={implementation} needs the {package!r} package, which is not installed here "
            f"(it needs a CUDA GPU): pip install {package.replace('_', '-')}; or model.attn_implementation=sdpa"
        )


def check_policy(values: dict[str, Any]) -> None:
    """``policy=kvpress`` needs kvpress."""
    target = str((values.get("policy") or {}).get("_target_", ""))
    module, install = POLICY_PACKAGES.get(target, (None, ""))
    if module is not None and not installed(module):
        name = target.rpartition(".")[2]
        raise MissingNeed(f"{name} (policy) needs {module}, which is not installed here: {install}")


def check_logger(values: dict[str, Any]) -> None:
    """``logger=wandb`` needs wandb."""
    backend = (values.get("logger") or {}).get("backend", "none")
    if backend == "wandb" and not installed("wandb"):
        raise MissingNeed(
            'logger=wandb needs the wandb package, which is not installed here: pip install -e ".[tracking]"; '
            "or logger=none"
        )


def check_launcher(launcher: str | None) -> None:
    """``hydra/launcher=joblib|slurm`` needs its Hydra plugin."""
    module, install = LAUNCHER_PACKAGES.get(str(launcher), (None, ""))
    if module is not None and not installed(module):
        raise MissingNeed(
            f"hydra/launcher={launcher} needs a Hydra plugin that is not installed here: {install}; or leave "
            "hydra/launcher out (one job after another)"
        )


def check_needs(values: dict[str, Any], launcher: str | None = None) -> None:
    """Every optional need of a run's resolved config (``values``) and of its launcher (Hydra's choice): all that
    are missing are named together, in one line, so that one install round fixes them."""
    missing = []
    for check in (check_punkt, check_flash, check_quantization, check_policy, check_logger):
        try:
            check(values)
        except MissingNeed as error:
            missing.append(str(error))
    try:
        check_launcher(launcher)
    except MissingNeed as error:
        missing.append(str(error))
    if missing:
        raise MissingNeed("; also, ".join(missing))
