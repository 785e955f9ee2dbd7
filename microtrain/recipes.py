"""The curriculum as values: stages, task mixtures and the recipes ``v1``, ``v2``, ``v3`` (:data:`RECIPES`).

Induction heads first (random token sequences repeated, loss on the second copy), then the task
mixture, then length: lengths double (256 to 4096 prompt tokens) when the held-out exact match of
the current stage passes the stage's threshold, or after the stage's step cap; each stage also
replays shorter lengths. A recipe is frozen: a run's variations (``--batch-scale``, ``--smoke``)
are new tuples of stages made by :func:`scaled_stages` and :func:`smoke_stages`, never edits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from restkv.microtrain.config import WORK_DIR

TASK_WEIGHTS: dict[str, float] = {
    "niah_single_1": 1.0,
    "niah_single_2": 1.0,
    "niah_single_3": 1.0,
    "niah_multikey_1": 1.0,
    "niah_multikey_2": 1.0,
    "niah_multikey_3": 1.0,
    "niah_multivalue": 1.0,
    "niah_multiquery": 1.0,
    "vt": 1.5,
    "passkey": 0.5,
    "kv_retrieval": 0.75,
    "recall": 1.0,  # training-only warm-up task
    "copy": 1.0,
}
"""The default task mixture (adapted to held-out failures from stage :data:`ADAPT_FROM` on)."""

REPLAY = 0.25  # share of batches at a shorter, earlier length
POSE = 0.5  # share of batches (below 4096, in stages of 512 tokens or more) with a position skip
HELDOUT_PER_TASK = 6
SWEEP_PER_TASK = 4
WARMUP, FINAL_LR_FRACTION = 30, 0.1
ADAPT_FROM = "tasks-512"  # from this stage on, tasks still failing held out get more of each batch


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum: its prompt length, batch, step cap, advance threshold and mixture."""

    name: str
    length: int  # prompt tokens
    batch: int  # sequences per step
    max_steps: int
    threshold: float  # advance when the held-out exact match (mean over tasks) reaches this
    eval_every: int
    seconds_per_step: float  # estimate on 2 idle CPU cores: unused steps of earlier stages go to the last one
    lr: float = 2e-3
    copy_task: str | None = None  # an induction stage: only this copy task
    tasks: dict[str, float] | None = None  # this stage's own mixture (default: the adaptive one)
    cosine: bool = False  # decay to FINAL_LR_FRACTION of lr over the stage
    final: bool = False  # ends a phase: gets the unused time of earlier stages, then a full sweep


INDUCTION_STAGES: tuple[Stage, ...] = (
    Stage("induction-32", 32, 64, 1500, 0.90, 50, 0.2, lr=3e-3, copy_task="copy_short"),
    Stage("induction-128", 128, 32, 400, 0.95, 50, 0.3, lr=3e-3, copy_task="copy"),
)
"""The two induction stages every recipe starts with."""

V1_KEYS_MIXTURE = {
    "recall": 3.0,
    "niah_multikey_2": 2.0,
    "niah_multikey_3": 1.0,
    "kv_retrieval": 1.0,
    "niah_single_1": 0.5,
    "copy": 0.5,
}
STAGES_V1: tuple[Stage, ...] = (
    *INDUCTION_STAGES,
    Stage("tasks-256", 256, 16, 700, 0.90, 100, 0.55),
    # Key matching among several needles was still failing after 700 steps at 256 tokens (while
    # single needles were solved): short prompts with a few keys, as for induction, to grow it.
    Stage("keys-128", 128, 32, 600, 0.90, 50, 0.45, tasks=V1_KEYS_MIXTURE),
    # ... and recall was still at 0 % after those 600 steps: fewer keys, shorter prompts.
    Stage("recall-48", 48, 64, 500, 0.90, 50, 0.3, tasks={"recall": 1.0}),
    Stage("tasks-512", 512, 8, 600, 0.90, 100, 0.6),
    Stage("tasks-1024", 1024, 6, 400, 0.90, 100, 1.1),
    Stage("tasks-2048", 2048, 3, 300, 0.90, 100, 1.7),
    Stage("tasks-4096", 4096, 2, 400, 2.0, 100, 2.6, cosine=True, final=True),
)
"""Recipe v1, the model shipped before: key matching never formed (values follow a bare-space token)."""

V2_KEYS_MIXTURE = {
    "niah_multikey_1": 1.0,
    "niah_multikey_2": 1.0,
    "niah_multiquery": 1.0,
    "dense_keys": 1.0,
    "recall_gap2": 0.5,
    "niah_single_1": 0.3,
}
V2_LONG_MIXTURE = {**TASK_WEIGHTS, "recall": 0.0, "recall_gap2": 0.5, "dense_keys": 1.5}
STAGES_V2: tuple[Stage, ...] = (
    *INDUCTION_STAGES,
    # Key matching grows as induction does, one token of distance at a time: a value right after
    # its key (induction alone solves it), then after "key:", then after "key is:" (RULER's needle).
    Stage("recall-64", 64, 48, 400, 0.90, 50, 0.4, tasks={"recall": 1.0, "dense_keys": 0.5}),
    Stage("tasks-256", 256, 16, 700, 0.90, 100, 1.3, tasks={**TASK_WEIGHTS, "dense_keys": 2.0}),
    Stage("gap1-64", 64, 48, 300, 0.90, 50, 0.4, tasks={"recall_gap1": 1.0, "recall": 0.3}),
    Stage("gap2-64", 64, 48, 300, 0.90, 50, 0.4, tasks={"recall_gap2": 1.0, "recall_gap1": 0.3}),
    Stage("keys-256", 256, 16, 300, 2.0, 50, 1.5, tasks=V2_KEYS_MIXTURE),
    Stage("tasks-512", 512, 8, 400, 0.90, 100, 1.1, tasks=V2_LONG_MIXTURE),
    Stage("tasks-1024", 1024, 6, 300, 0.90, 100, 1.85, tasks=V2_LONG_MIXTURE),
    # The trial run ended here: tasks-2048 was its final stage (cosine), cut at step 2847 by
    # --max-hours 1.1. A full run continues to 4096 tokens (about 2 hours in all, estimated).
    Stage("tasks-2048", 2048, 3, 300, 0.90, 100, 2.4, tasks=V2_LONG_MIXTURE),
    Stage("tasks-4096", 4096, 2, 400, 2.0, 100, 4.0, tasks=V2_LONG_MIXTURE, cosine=True, final=True),
)
"""Recipe v2 (a 1.1 h trial, not shipped): numbers carry their space, and a key-gap curriculum."""

MICRO_MIXTURE = {
    "micro_single_1": 0.5,
    "micro_single_2": 0.5,
    "micro_multikey_1": 1.0,
    "micro_multikey_2": 1.0,
    "micro_multivalue": 1.5,
    "micro_multiquery": 1.5,
    "micro_vt": 1.5,
    "passkey": 0.3,
    "niah_single_1": 0.3,
    "niah_single_2": 0.3,
    "niah_multikey_1": 0.3,
    "dense_keys": 0.3,
}
MICRO_FOCUS = {
    **{task: 0.25 for task in MICRO_MIXTURE},
    "micro_multikey_1": 0.5,
    "micro_multikey_2": 1.5,
    "micro_multivalue": 1.5,
    "micro_multiquery": 1.5,
    "micro_vt": 2.0,
    "niah_multikey_1": 0.3,
    "dense_keys": 0.3,
}
STAGES_V3: tuple[Stage, ...] = (
    *STAGES_V2,
    # Phase 2: the micro suite's cued templates (restkv.eval.benchmarks.micro.benchmark), each answer item a cue
    # then the value after it in the context, from short prompts to 4096 tokens.
    Stage("micro-256", 256, 16, 500, 2.0, 50, 1.3, lr=1e-3, tasks=MICRO_MIXTURE),
    Stage("micro-1024", 1024, 6, 300, 2.0, 100, 1.85, lr=1e-3, tasks=MICRO_MIXTURE),
    Stage("micro-2048", 2048, 3, 400, 2.0, 100, 2.4, lr=1e-3, tasks=MICRO_MIXTURE),
    Stage("micro-4096", 4096, 2, 250, 2.0, 100, 4.0, lr=1e-3, tasks=MICRO_MIXTURE, cosine=True, final=True),
    # Phase 3: at the end of phase 2, the multi-item tasks were still weak at 2048 tokens held out
    # (multi-key over a haystack of needles, multi-value, multi-query, vt); more of them at 2048.
    Stage("micro-2048-focus", 2048, 3, 450, 2.0, 100, 2.6, lr=6e-4, tasks=MICRO_FOCUS, cosine=True, final=True),
)
"""Recipe v3, the shipped model: recipe v2, then two phases on the micro suite's templates (about an hour)."""


@dataclass(frozen=True)
class Recipe:
    """What differs between training recipes: the tokenizer's number split, the drills, the stages."""

    space_before_numbers: bool
    recall_gaps: dict[str, str]  # recall drill name -> text between a key and its value
    stages: tuple[Stage, ...]
    work_dir: Path


GAP_DRILLS = {"recall": "", "recall_gap1": ":", "recall_gap2": " is:"}
RECIPES: dict[str, Recipe] = {
    "v1": Recipe(False, {"recall": ":"}, STAGES_V1, WORK_DIR),
    "v2": Recipe(True, dict(GAP_DRILLS), STAGES_V2, WORK_DIR.with_name("micro_model_v2")),
    "v3": Recipe(True, dict(GAP_DRILLS), STAGES_V3, WORK_DIR.with_name("micro_model_v3")),
}
"""Every recipe by its ``--recipe`` name; v3's first stages are v2's (a v2 checkpoint resumes into v3)."""


def scaled_stages(recipe: Recipe, batch_scale: int) -> tuple[Stage, ...]:
    """``recipe``'s stages with every batch multiplied by ``batch_scale`` (``--batch-scale``)."""
    return tuple(replace(stage, batch=stage.batch * batch_scale) for stage in recipe.stages)


def smoke_stages(stages: tuple[Stage, ...], batch_scale: int) -> tuple[Stage, ...]:
    """``--smoke``: the first and last three stages, 3 steps each of 2 sequences (times ``batch_scale``), short."""
    return tuple(
        replace(s, length=min(s.length, 1024), batch=2 * batch_scale, max_steps=3, eval_every=2, seconds_per_step=1.0)
        for s in (*stages[:3], *stages[-3:])
    )


def task_lengths(stages: tuple[Stage, ...]) -> list[int]:
    """The distinct prompt lengths of the task stages, in order (the lengths a sweep evaluates)."""
    return list(dict.fromkeys(s.length for s in stages if s.copy_task is None))
