"""The training loop: stages in order, each ended by its threshold or step cap, phases ended by a final stage.

A stage advances when the held-out exact match (every ``eval_every`` steps) reaches its threshold,
or after its step cap, with a sweep over every length logged first. A phase's final stage gets
the time its phase's earlier stages left unused (or ``--final-steps``), ends with an evaluation at
every length and a checkpoint; ``--max-hours`` / ``--stop-at-step`` end it early and skip the
later phases. Checkpoints are written every ``--save-every`` seconds; ``--resume`` continues.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from restkv.microtrain.batches import BatchSource
from restkv.microtrain.checkpoint import load_checkpoint, save_checkpoint
from restkv.microtrain.config import CHECKPOINT
from restkv.microtrain.curriculum import State, begin_stage, lr_at, stage_steps
from restkv.microtrain.evaluation import evaluate
from restkv.microtrain.examples import TaskData
from restkv.microtrain.export import export
from restkv.microtrain.model import build_model, make_optimizer, train_step
from restkv.microtrain.options import RunOptions
from restkv.microtrain.recipes import HELDOUT_PER_TASK, SWEEP_PER_TASK, Stage, task_lengths
from restkv.microtrain.tokenizer import load_or_train_tokenizer


@dataclass
class Session:
    """One training run's objects, made once by :func:`open_session` and shared by the loop's parts."""

    options: RunOptions
    stages: tuple[Stage, ...]
    checkpoint: Path
    tokenizer: PreTrainedTokenizerFast
    data: TaskData
    batches: BatchSource
    model: LlamaForCausalLM
    optimizer: torch.optim.Optimizer
    state: State

    def evaluate(self, lengths: list[int], per_task: int, tag: str) -> float:
        """:func:`~restkv.microtrain.evaluation.evaluate` on this run's model, data, stages and precision."""
        model, data, stages, state = self.model, self.data, self.stages, self.state
        return evaluate(model, data, stages, state, lengths, per_task, tag, self.options.precision)

    def save(self) -> None:
        """Write the checkpoint."""
        save_checkpoint(self.checkpoint, self.model, self.optimizer, self.state, self.options.batch_scale)

    def out_of_time(self) -> bool:
        """Whether ``--max-hours`` or ``--stop-at-step`` has been reached (they end a final stage)."""
        options, state = self.options, self.state
        return state.elapsed > options.max_hours * 3600 or (
            options.stop_at_step is not None and state.step >= options.stop_at_step
        )


def open_session(options: RunOptions) -> Session:
    """Tokenizer, data, batch workers, model and optimizer, resumed from the checkpoint if there is one.

    The batch workers fork before the model reaches a GPU. Without ``--resume`` (or
    ``--export-only``) an existing checkpoint is refused rather than overwritten.
    """
    torch.set_num_threads(options.threads)
    work_dir = options.checkpoint_dir()
    work_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = work_dir / CHECKPOINT
    if checkpoint.exists() and not (options.resume or options.export_only):
        raise SystemExit(f"{checkpoint} exists: pass --resume to continue it (or delete it to start over)")
    recipe, stages = options.recipe_value, options.stages()
    tokenizer = load_or_train_tokenizer(work_dir / "tokenizer", recipe.space_before_numbers)
    data = TaskData(tokenizer, recipe.recall_gaps)
    batches = BatchSource(data, stages, options.workers)
    model = build_model(tokenizer).to(options.device)
    optimizer = make_optimizer(model, stages[0].lr)
    state = State()
    if checkpoint.exists():
        state = load_checkpoint(checkpoint, model, optimizer, stages, options)
    if options.final_steps and state.final_stage == state.stage:  # the final stage has begun: resize it and its cosine
        state.final_steps = options.final_steps
        print(f"final stage resized to {state.final_steps} steps", flush=True)
    return Session(options, stages, checkpoint, tokenizer, data, batches, model, optimizer, state)


def advance(session: Session) -> None:
    """Move to the next stage (logging a sweep over every length first, after a task stage)."""
    state, stages = session.state, session.stages
    stage = stages[state.stage]
    if stage.copy_task is None:
        session.evaluate(task_lengths(stages), SWEEP_PER_TASK, "sweep")
    state.saved_seconds += (stage.max_steps - state.stage_step) * stage.seconds_per_step
    state.log.append({"kind": "advance", "step": state.step, "from": stage.name, "elapsed_s": round(state.elapsed)})
    state.stage += 1
    state.stage_step = 0
    begin_stage(stages, state, session.options.final_steps)


def end_phase(session: Session, out_of_time: bool) -> None:
    """A final stage is over: evaluate at every length, skip the later phases if out of time, checkpoint."""
    state, stages = session.state, session.stages
    stage = stages[state.stage]
    tick = time.time()
    session.evaluate(task_lengths(stages), HELDOUT_PER_TASK, "final")
    state.log.append({"kind": "advance", "step": state.step, "from": stage.name})
    if out_of_time and state.stage < len(stages) - 1:
        print(f"later phases skipped: {[s.name for s in stages[state.stage + 1 :]]}", flush=True)
        state.log.append({"kind": "skipped", "step": state.step, "stages": len(stages) - state.stage - 1})
        state.stage = len(stages) - 1
    state.stage += 1
    state.stage_step = 0
    state.saved_seconds = 0.0
    state.elapsed += time.time() - tick
    session.save()
    if state.stage < len(stages):
        print("=== phase ends", flush=True)
        begin_stage(stages, state, session.options.final_steps)


@dataclass
class Progress:
    """Throughput and mean loss over the last 20 steps, for the log line printed every 20 steps."""

    start: float = field(default_factory=time.time)
    tokens: int = 0
    loss: float = 0.0

    def report(self, session: Session, limit: int) -> None:
        """Print the window's line and start a new window."""
        state, stage = session.state, session.stages[session.state.stage]
        seconds = time.time() - self.start
        print(
            f"step {state.step} [{stage.name} {state.stage_step}/{limit}] loss {self.loss / 20:.4f} "
            f"lr {lr_at(session.stages, state):.2e} {self.tokens / seconds:.0f} tok/s {seconds / 20:.2f} s/step "
            f"elapsed {state.elapsed / 60:.1f} min load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        self.start, self.tokens, self.loss = time.time(), 0, 0.0


def take_step(session: Session, progress: Progress, limit: int) -> None:
    """One training step on the step's batch, at the step's learning rate."""
    state, stages, options = session.state, session.stages, session.options
    tick = time.time()
    ids, positions, labels = (t.to(options.device, non_blocking=True) for t in session.batches.next(state))
    for group in session.optimizer.param_groups:
        group["lr"] = lr_at(stages, state)
    loss = train_step(session.model, session.optimizer, ids, positions, labels, options.precision)
    state.step += 1
    state.stage_step += 1
    state.elapsed += time.time() - tick
    progress.tokens += ids.numel()
    progress.loss += loss.item()
    if state.step % 20 == 0:
        progress.report(session, limit)


def run_stages(session: Session) -> None:
    """Train until every stage is done (or skipped), with held-out checks and periodic checkpoints."""
    state, stages = session.state, session.stages
    last_save = time.time()
    progress = Progress()
    while state.stage < len(stages):
        stage = stages[state.stage]
        limit = stage_steps(stages, state)
        out_of_time = stage.final and session.out_of_time()
        if state.stage_step >= limit or out_of_time:
            if out_of_time:
                print(f"time or step limit reached: stage {stage.name} ends at step {state.step}", flush=True)
            if stage.final:
                end_phase(session, out_of_time)
                continue
            tick = time.time()
            advance(session)
            state.elapsed += time.time() - tick
            continue
        take_step(session, progress, limit)
        if state.stage_step % stage.eval_every == 0:
            tick = time.time()
            mean = session.evaluate([stage.length], HELDOUT_PER_TASK, "heldout")
            if mean >= stage.threshold and state.stage < len(stages) - 1:
                advance(session)
            state.elapsed += time.time() - tick
        if time.time() - last_save > session.options.save_every:
            session.save()
            last_save = time.time()


def train(options: RunOptions) -> None:
    """Train (or, with ``export_only``, export) the model ``options`` describe, and export it."""
    session = open_session(options)
    try:
        if not options.export_only:
            params = sum(p.numel() for p in session.model.parameters()) / 1e6
            vocabulary = len(session.tokenizer)
            print(f"model: {params:.2f}M parameters; vocabulary {vocabulary}; threads {options.threads}", flush=True)
            session.model.train()
            run_stages(session)
    finally:
        session.batches.close()
    if not options.export_only:
        session.save()
        print(f"done: {session.state.step} steps, {session.state.elapsed / 3600:.2f} h of training", flush=True)
    export(session.model, session.tokenizer, session.state, options.export_dir, session.stages, options)
