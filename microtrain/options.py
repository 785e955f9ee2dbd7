"""How one run trains a recipe (the command line's settings), passed explicitly to what needs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from restkv.microtrain.config import EXPORT_DIR
from restkv.microtrain.recipes import RECIPES, Recipe, Stage, scaled_stages, smoke_stages

Precision = Literal["fp32", "bf16"]
"""``fp32``, or ``bf16``: the forward passes run under bfloat16 autocast (for GPUs)."""


@dataclass(frozen=True)
class RunOptions:
    """One run's settings; each field is the ``scripts/train_micro_model.py`` flag of the same name."""

    recipe: str = "v3"
    device: str = "cpu"
    threads: int = 2
    precision: Precision = "fp32"
    batch_scale: int = 1  # every stage's batch is multiplied by it: more data per step, same curriculum
    workers: int = 0  # processes that make batches ahead (0: in the training process)
    max_hours: float = 3.0
    stop_at_step: int | None = None
    final_steps: int | None = None
    save_every: float = 300.0
    resume: bool = False
    export_only: bool = False
    smoke: bool = False
    work_dir: Path | None = None  # None: the recipe's folder (with a ``_batch<scale>`` suffix when scaled)
    export_dir: Path = EXPORT_DIR

    def __post_init__(self) -> None:
        """Refuse settings no run can use, before anything is written."""
        if self.batch_scale < 1 or self.workers < 0:
            raise ValueError(
                f"--batch-scale must be >= 1 and --workers >= 0, got {self.batch_scale} and {self.workers}"
            )
        if self.recipe not in RECIPES:
            raise ValueError(f"unknown recipe {self.recipe!r}; known: {sorted(RECIPES)}")

    @property
    def recipe_value(self) -> Recipe:
        """The recipe this run trains."""
        return RECIPES[self.recipe]

    def stages(self) -> tuple[Stage, ...]:
        """The run's stages: the recipe's, batches scaled, reduced to a few steps with ``smoke``."""
        stages = scaled_stages(self.recipe_value, self.batch_scale)
        return smoke_stages(stages, self.batch_scale) if self.smoke else stages

    def checkpoint_dir(self) -> Path:
        """Where the checkpoint and the tokenizer go: ``work_dir``, or one folder per recipe and batch scale."""
        if self.work_dir is not None:
            return self.work_dir
        folder = self.recipe_value.work_dir
        return folder if self.batch_scale == 1 else folder.with_name(f"{folder.name}_batch{self.batch_scale}")
