"""Train ``models/micro-llama`` from scratch on a CPU: a small Llama that retrieves over 4096 tokens.

No pretrained weights can be downloaded here, and random weights retrieve nothing, so this script
trains the repository's own long-context test model, deterministically, in about 2.7 hours on two
CPU cores (recipe v3; the points below describe the first recipe, v1, and ``--recipe`` what changed):

* **Tokenizer**: a byte-level BPE (8192 tokens) trained with ``tokenizers`` on the training novel
  (*Pride and Prejudice*, :data:`restkv.eval.benchmarks.shared.haystack.TRAIN_HAYSTACK`) and on text generated
  by the training tasks below. Numbers are pre-split into groups of up to three digits (a 7-digit
  needle value is 3 tokens), a UUID is one pre-token (BPE merges hex pairs and triples: ~17
  tokens), a word keeps its leading space (as GPT-2). BOS is prepended by the tokenizer; every
  answer ends with EOS.
* **Model**: Llama architecture (RoPE, GQA 6 query / 2 key-value heads, RMSNorm, SwiGLU), hidden
  192, 4 layers, tied embeddings, ~3.1M parameters.
* **Curriculum** (the trials in the issue): induction heads first (random token sequences
  repeated, loss on the second copy), then the task mixture, then length. The mixture holds all
  RULER needle families (``niah_single_1/2/3``, ``niah_multikey_1/2/3``, ``niah_multivalue``,
  ``niah_multiquery``: noise, essay and needle haystacks, with RULER's exact templates), RULER's
  variable tracking ``vt``, the classic passkey prompt and a key-value (JSON) retrieval, plus some
  copy. Prompts are generated with RULER's own builders (``restkv.eval.benchmarks.ruler``) from seeds
  ``>= 10**6`` (evaluation uses small seeds), essays are random windows of the training novel
  (the evaluation novel, *Emma*, is never read here). The loss covers the answer tokens only (and
  EOS). Lengths double (256, 512, 1024, 2048, 4096 prompt tokens) when the held-out exact-match
  accuracy of the current stage passes the stage's threshold, or after the stage's step cap; each
  stage also replays shorter lengths. Below 4096, half of the batches shift the positions of a
  random suffix (PoSE, Zhu et al. 2024) so that every RoPE distance up to 4096 is seen early.
* **Held-out monitoring**: teacher-forced exact-match and per-token accuracy per task on prompts
  from separate seeds (training novel), logged every few hundred steps to ``training_log.json``.
* **Resumable**: a checkpoint (model, optimizer, RNG states, curriculum state, step, log) is
  written to the recipe's folder (``outputs/micro_model_v3/checkpoint.pt`` for v3) every few
  minutes; ``--resume`` continues from it. Data depend only on (step, index), so a resumed run sees the same batches.

* **Recipes** (``--recipe``): ``v3`` (the default) is the recipe of the shipped model: ``v2``,
  then two phases on the micro suite's cued templates (:mod:`restkv.eval.benchmarks.micro.benchmark`), about 2.7
  hours in all. ``v1`` (the model shipped before, described above) makes the space before a
  number a token of its own, so every value follows the same token, and key matching never
  formed. ``v2`` attaches the space to the number and grows key matching with a gap curriculum:
  ``key value``, then ``key: value``, then ``key is: value``. The model card has every run's
  numbers. Checkpoints go to one folder per recipe; v3's first stages are v2's, so a v2
  checkpoint copied into v3's folder resumes into v3's later phases.

    python scripts/train_micro_model.py                 # train from scratch (refuses to overwrite)
    python scripts/train_micro_model.py --recipe v2     # the key-matching recipe alone
    python scripts/train_micro_model.py --resume        # continue after an interruption
    python scripts/train_micro_model.py --export-only   # write models/micro-llama from the checkpoint

Run it in the background: ``nohup python scripts/train_micro_model.py --resume >>
outputs/micro_model_v3/train.log 2>&1 &`` (``--resume`` starts from scratch when no checkpoint exists).

**On a GPU** (``scripts/train_micro_model_gpu.sh``, not run yet): the same recipe with
``--batch-scale`` times the data per step, ``--workers`` processes making the batches ahead (on
a GPU, making a batch costs about as much as training on it) and ``--precision bf16``;
``scripts/estimate_training_time.py`` sizes the batch for the time available first, since
``--max-hours`` skips the phases it cannot reach.

The code is the package :mod:`microtrain` (one module per job: tokenizer, samples, examples,
recipes, batches, loop, evaluation, checkpoint, export); this file is its command line.
"""

from __future__ import annotations

from restkv.microtrain.cli import main

if __name__ == "__main__":
    main(description=__doc__)
