"""Each step's batch: input ids, position ids and labels, made from the step alone.

A batch depends on (step, stage, the held-out log), never on what ran before, so that a resumed
run and the batch workers make exactly the batches the training process would.
"""

from __future__ import annotations

import multiprocessing
import random
from multiprocessing.pool import AsyncResult
from typing import Any

import torch

from restkv.microtrain.config import MAX_LENGTH, TRAIN_SEED_BASE
from restkv.microtrain.curriculum import State, pick_tasks, stage_steps, task_weights
from restkv.microtrain.examples import Example, TaskData
from restkv.microtrain.recipes import POSE, REPLAY, Stage

Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""Input ids, position ids, labels (-100: not supervised), each ``[batch, width]``."""


def _draw_examples(
    data: TaskData, stages: tuple[Stage, ...], state: State, rng: random.Random
) -> tuple[list[Example], int]:
    """The step's examples (at the stage's length, or replaying an earlier one) and that length."""
    stage = stages[state.stage]
    length, batch = stage.length, stage.batch
    earlier = [s for s in stages[: state.stage] if s.copy_task is None]
    if earlier and rng.random() < REPLAY:
        replay = rng.choice(earlier)
        length, batch = replay.length, replay.batch
    examples: list[Example] = []
    attempt = 0
    weights = stage.tasks if stage.tasks and length == stage.length else task_weights(stages, state, length)
    while len(examples) < batch:
        task = stage.copy_task or pick_tasks(rng, 1, weights)[0]
        example = data.example(task, length, TRAIN_SEED_BASE + 1000 * state.step + attempt)
        attempt += 1
        if example is not None:
            examples.append(example)
    return examples, length


def make_batch(
    data: TaskData, stages: tuple[Stage, ...], state: State
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Example]]:
    """The batch of ``state.step`` in ``stages`` (and its examples).

    Below 4096 tokens, in stages of 512 or more, half of the batches shift the positions of a
    random suffix (PoSE, Zhu et al. 2024) so that every RoPE distance up to 4096 is seen early.
    """
    rng = random.Random(f"batch/{state.step}")
    examples, length = _draw_examples(data, stages, state, rng)
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), data.tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    positions = torch.arange(width).repeat(len(examples), 1)
    use_pose = stages[state.stage].length >= 512 and length < MAX_LENGTH and rng.random() < POSE
    for row, example in enumerate(examples):
        n = len(example.ids)
        ids[row, :n] = torch.tensor(example.ids)
        labels[row, example.answer_start - 1 : n - 1] = torch.tensor(example.ids[example.answer_start :])
        for start, stop in example.earlier_answers:
            labels[row, start - 1 : stop - 1] = torch.tensor(example.ids[start:stop])
        if use_pose:
            cut = rng.randrange(1, example.answer_start)
            positions[row, cut:] += rng.randrange(0, MAX_LENGTH - width + 1)
    return ids, positions, labels, examples


def weights_log(log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``log`` that :func:`~restkv.microtrain.curriculum.task_weights` reads (each task's latest
    held-out row, overall and per length): all a worker needs of the log."""
    latest: dict[tuple[str, int | None], int] = {}
    for index, row in enumerate(log):
        if row.get("kind") in ("heldout", "sweep") and "exact" in row:
            latest[(row["task"], None)] = index
            latest[(row["task"], row["length"])] = index
    return [log[i] for i in sorted(set(latest.values()))]


_worker: tuple[TaskData, tuple[Stage, ...]] | None = None
"""A batch worker's data and stages, set in the worker process by :func:`_start_worker` (never in the parent)."""


def _start_worker(data: TaskData, stages: tuple[Stage, ...]) -> None:
    """Pool initializer, run in each worker: one thread, and the data and stages the worker was forked with."""
    global _worker
    torch.set_num_threads(1)
    _worker = (data, stages)


def _batch_in_worker(state: State) -> Batch:
    """:func:`make_batch` in a worker, from what :func:`_start_worker` received."""
    assert _worker is not None, "not a batch worker"
    data, stages = _worker
    ids, positions, labels, _ = make_batch(data, stages, state)
    return ids, positions, labels


class BatchSource:
    """Each step's batch: made ahead by ``workers`` processes, or in this process when there are none.

    Data generation is as costly as a training step on a GPU. A batch depends on the step, the
    stage and the held-out log (the adaptive mixture), and the log changes only at an
    evaluation, so the workers make the batches up to the next evaluation from a snapshot of
    those; every batch equals what :func:`make_batch` gives in this process. The workers are
    forked (create the source before the model reaches a GPU) and receive ``data`` and
    ``stages`` through the pool's initializer, as the fork's copy: nothing is pickled.
    """

    def __init__(self, data: TaskData, stages: tuple[Stage, ...], workers: int, ahead: int | None = None) -> None:
        self.data = data
        self.stages = stages
        self.ahead = ahead or 4 * workers
        self.pool = None
        if workers > 0:
            context = multiprocessing.get_context("fork")
            self.pool = context.Pool(workers, initializer=_start_worker, initargs=(data, stages))
        self.pending: dict[int, AsyncResult] = {}
        self.key: tuple[int, int, int] | None = None
        self.snapshot: list[dict[str, Any]] = []

    def next(self, state: State) -> Batch:
        """The batch of ``state.step``, queueing the following ones (up to the next evaluation) in the workers."""
        if self.pool is None:
            ids, positions, labels, _ = make_batch(self.data, self.stages, state)
            return ids, positions, labels
        key = (state.stage, state.step - state.stage_step, len(state.log))
        if key != self.key:
            self.key, self.pending, self.snapshot = key, {}, weights_log(state.log)
        stage = self.stages[state.stage]
        next_eval = (state.stage_step // stage.eval_every + 1) * stage.eval_every
        last = min(next_eval, stage_steps(self.stages, state), state.stage_step + self.ahead)
        for stage_step in range(state.stage_step, last):  # stage steps [stage_step, last)
            step = state.step + stage_step - state.stage_step
            if step not in self.pending:
                ahead = State(step=step, stage=state.stage, stage_step=stage_step, log=self.snapshot)
                self.pending[step] = self.pool.apply_async(_batch_in_worker, (ahead,))
        return self.pending.pop(state.step).get()

    def close(self) -> None:
        """Stop the workers (batches still queued are dropped)."""
        if self.pool is not None:
            self.pool.terminate()
