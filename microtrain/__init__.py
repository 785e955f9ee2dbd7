"""Training of ``models/micro-llama``, the repository's own long-context test model, from scratch on a CPU.

One module per job, in the order a run uses them:

* :mod:`microtrain.config`: paths, special tokens, sizes, seed ranges and the model's shape;
* :mod:`microtrain.samples`: the prompts (RULER's and the micro suite's builders, passkey, key-value
  retrieval, the recall drills) and the answer each is taught;
* :mod:`microtrain.tokenizer`: the byte-level BPE and the text it is trained on;
* :mod:`microtrain.examples`: token sequences (supervised spans, copy and dense-key data) from seeds;
* :mod:`microtrain.recipes`: the stages, mixtures and recipes ``v1``, ``v2``, ``v3`` as values;
* :mod:`microtrain.options`: :class:`~microtrain.options.RunOptions`, how one run trains a recipe;
* :mod:`microtrain.curriculum`: the run's position (:class:`~microtrain.curriculum.State`), stage
  lengths, learning rate and the adaptive mixture;
* :mod:`microtrain.batches`: each step's batch, in process or made ahead by forked workers;
* :mod:`microtrain.model`: the model, optimizer, loss and one training step;
* :mod:`microtrain.evaluation`: held-out teacher-forced accuracy, logged;
* :mod:`microtrain.checkpoint` and :mod:`microtrain.export`: resumable checkpoints, the Hugging Face folder;
* :mod:`microtrain.loop` and :mod:`microtrain.cli`: the training loop and ``scripts/train_micro_model.py``'s flags.

Nothing here is rewritten at run time: a recipe is a frozen value, and the run's settings (batch
scale, precision, device, workers) are a :class:`~microtrain.options.RunOptions` passed to what needs them.
"""

from __future__ import annotations

import os

# Sleep, not spin, when an OpenMP thread waits: with other processes on the two cores, spinning
# threads make every step several times slower. Must be set before torch starts OpenMP, hence
# here, before any module of the package imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
