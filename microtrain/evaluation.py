"""Held-out monitoring: teacher-forced exact match and per-token accuracy per task, appended to the run's log.

The log decides when a stage advances and, from stage ``tasks-512`` on, the task mixture
(:func:`restkv.microtrain.curriculum.task_weights`); it is exported as ``training_log.json``.
"""

from __future__ import annotations

import torch
from transformers import LlamaForCausalLM

from restkv.microtrain.curriculum import State
from restkv.microtrain.examples import COPY_TASKS, Example, TaskData
from restkv.microtrain.model import autocast
from restkv.microtrain.options import Precision
from restkv.microtrain.recipes import TASK_WEIGHTS, Stage


@torch.no_grad()
def score_examples(
    model: LlamaForCausalLM, examples: list[Example], precision: Precision = "fp32"
) -> tuple[float, float]:
    """Teacher-forced exact match (every answer token is the argmax) and per-token accuracy.

    EOS is not counted. A teacher-forced exact match is exactly what greedy decoding produces.
    """
    exact, correct, total = 0, 0, 0
    for example in examples:
        ids = torch.tensor([example.ids], device=model.device)
        start, stop = example.answer_start, len(example.ids) - (0 if example.task in COPY_TASKS else 1)
        with autocast(ids.device, precision):
            hidden = model.model(input_ids=ids).last_hidden_state
            predicted = model.lm_head(hidden[0, start - 1 : stop - 1]).argmax(-1)
        gold = ids[0, start:stop]
        hits = int((predicted == gold).sum())
        exact += int(hits == len(gold))
        correct += hits
        total += len(gold)
    return exact / max(len(examples), 1), correct / max(total, 1)


def evaluated_tasks(stage: Stage) -> list[str]:
    """What a stage is judged on: its copy task (induction), else its mixture's tasks but copy."""
    if stage.copy_task:
        return [stage.copy_task]
    return [t for t in stage.tasks or TASK_WEIGHTS if t not in COPY_TASKS]


def evaluate(
    model: LlamaForCausalLM,
    data: TaskData,
    stages: tuple[Stage, ...],
    state: State,
    lengths: list[int],
    per_task: int,
    tag: str,
    precision: Precision = "fp32",
) -> float:
    """Held-out accuracy per task at each length, appended to the log; returns the mean at the first length.

    The mean is of exact match, except in the induction stages: per-token copy accuracy there.
    """
    model.eval()
    stage = stages[state.stage]
    means = []
    for length in lengths:
        rows = []
        for task in evaluated_tasks(stage):
            examples = data.heldout(task, length, per_task)
            if not examples:
                continue
            exact, token = score_examples(model, examples, precision)
            rows.append((task, exact, token))
            state.log.append(
                {
                    "kind": tag,
                    "step": state.step,
                    "stage": stage.name,
                    "elapsed_s": round(state.elapsed),
                    "length": length,
                    "task": task,
                    "n": len(examples),
                    "exact": round(exact, 4),
                    "token_acc": round(token, 4),
                }
            )
        mean = sum(r[2] if stage.copy_task else r[1] for r in rows) / max(len(rows), 1)
        means.append(mean)
        table = " ".join(f"{t}={e:.2f}/{k:.2f}" for t, e, k in rows)
        print(f"[{tag}] step {state.step} length {length} mean exact {mean:.3f} | {table}", flush=True)
    model.train()
    return means[0] if means else 0.0
