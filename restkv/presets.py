"""Named settings of ReST-KV from the paper and the authors' runs (see `restkv.registry.register_preset`).

- ``restkv_ruler``: ReST-KV as the authors ran RULER and InfiniteBench, minimum adaptive kernel 21
  (their ``scripts/ruler/run_llama3.sh``).
- ``ada_restkv``: Ada-ReST-KV, ReST-KV's scores under AdaKV's head-wise allocation (the paper's
  plug-and-play combination with a budget allocator; ``floor`` 0.2, normalised, as AdaKV runs).
- ``dropkv``: DropKV as we read its definition, ReST-KV's indicator squared and without ``W_o``
  (``a/(1-a) * ||o - v||`` per token, squared before the adaptive smoothing); every other stage is
  ReST-KV's. A configuration over the existing stages, no code of its own.
- ``restkv_defensive``: ReST-KV with DefensiveKV's worst-case aggregation of the window (``temporal``
  ``defensive``: the maximum over the window's queries, floored at its mean) instead of the EMA.
- ``ablation/*``: the rows of the paper's indicator / temporal / spatial ablation (Table 3,
  Appendix Table 12); ``restkv`` itself is the full method's row.
"""

from __future__ import annotations

from restkv.registry import register_preset

register_preset("restkv_ruler", "restkv", kernel=21)
register_preset("ada_restkv", "restkv", allocation="adakv")
register_preset("dropkv", "restkv", use_wo=False, power=2.0)
register_preset("restkv_defensive", "restkv", temporal="defensive")

# attention x ||v||, summed over the window, average-pooled (kernel 5)
register_preset("ablation/attn_v", "restkv", indicator="attention_value", temporal="sum", spatial="avgpool")
# the reconstruction indicator under each temporal aggregation, without spatial smoothing
register_preset("ablation/recon_last", "restkv", temporal="last", spatial="none")
register_preset("ablation/recon_mean", "restkv", temporal="mean", spatial="none")
register_preset("ablation/recon_inv_ema", "restkv", temporal="inv_ema", spatial="none")
register_preset("ablation/recon_ema", "restkv", temporal="ema", spatial="none")
# the EMA row with fixed-kernel smoothing instead of the adaptive one
register_preset("ablation/recon_ema_avgpool", "restkv", spatial="avgpool")
register_preset("ablation/recon_ema_maxpool", "restkv", spatial="maxpool")
