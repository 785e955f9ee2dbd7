"""How samples are evaluated: a strategy named by the config (``evaluation=generate|fidelity``).

A benchmark stays samples plus a scorer; the strategy decides what the model does with each
prompt under the compressor and what the record holds:

- `Generate` (the default): greedy answer, then the benchmark's scorer;
- `Fidelity`: teacher-forced divergence of the compressed model from the full cache, a
  continuous signal on any checkpoint (``bench=fidelity`` selects it; ``evaluation=fidelity``
  applies it to any benchmark);
- `MultiTurn`: several questions about one compressed context, in turn (``evaluation=multi_turn``).

A new strategy is one class with ``evaluate`` and ``report`` (see `Evaluation`) plus a config
file in ``configs/evaluation/``.
"""

from restkv.eval.evaluation.base import Compressor, Evaluation, Session
from restkv.eval.evaluation.fidelity import Fidelity
from restkv.eval.evaluation.generate import Generate
from restkv.eval.evaluation.multi_turn import MultiTurn

__all__ = ["Compressor", "Evaluation", "Fidelity", "Generate", "MultiTurn", "Session"]
