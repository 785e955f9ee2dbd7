"""Training of ``models/micro-llama``, the repository's own long-context test model, from scratch on a CPU.

One module per job, in the order a run uses them:

* :mod:`restkv.microtrain.config`: paths, special tokens, sizes, seed ranges and the model's shape;
* :mod:`restkv.microtrain.samples`: the prompts (RULER's and the micro suite's builders, passkey, key-value
  retrieval, the recall drills) and the answer each is taught;
* :mod:`restkv.microtrain.tokenizer`: the byte-level BPE and the text it is trained on;
* :mod:`restkv.microtrain.examples`: token sequences (supervised spans, copy and dense-key data) from seeds;
* :mod:`restkv.microtrain.recipes`: the stages, mixtures and recipes ``v1``, ``v2``, ``v3`` as values;
* :mod:`restkv.microtrain.options`: :class:`~restkv.microtrain.options.RunOptions`, how one run trains a recipe;
* :mod:`restkv.microtrain.curriculum`: the run's position (:class:`~restkv.microtrain.curriculum.State`), stage
  lengths, learning rate and the adaptive mixture;
* :mod:`restkv.microtrain.batches`: each step's batch, in process or made ahead by forked workers;
* :mod:`restkv.microtrain.model`: the model, optimizer, loss and one training step;
* :mod:`restkv.microtrain.evaluation`: held-out teacher-forced accuracy, logged;
* :mod:`restkv.microtrain.checkpoint` and :mod:`restkv.microtrain.export`: resumable checkpoints, the Hugging Face
  folder;
* :mod:`restkv.microtrain.loop` and :mod:`restkv.microtrain.cli`: the training loop and
  ``scripts/train_micro_model.py``'s flags.

Nothing here is rewritten at run time: a recipe is a frozen value, and the run's settings (batch
scale, precision, device, workers) are a :class:`~restkv.microtrain.options.RunOptions` passed to what needs them.
"""

from __future__ import annotations

import os

# Sleep, not spin, when an OpenMP thread waits: with other processes on the two cores, spinning
# threads make every step several times slower. Must be set before torch starts OpenMP, hence
# here, before any module of the package imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
