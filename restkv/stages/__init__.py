"""A policy's stages: the parts of a selection that any scoring can be combined with.

- `restkv.stages.resolve`: the stages resolved once from a policy's flat knobs (`resolve_stages`), and the rules
  that span two stages.
- `restkv.stages.schedule`: how many tokens each layer keeps (uniform, PyramidKV's pyramid).
- `restkv.stages.allocation`: how a layer's budget is shared by its heads (AdaKV, CriticalKV, HeadKV, one budget
  over every layer).
- `restkv.stages.merge`: evicted values folded into the tokens that stay (CAM).
- `restkv.stages.channels`: key channels pruned on the kept tokens (ThinK).
"""
