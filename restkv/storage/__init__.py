"""What a layer's cache becomes after eviction, and how it is read back.

- `restkv.storage.pipeline`: the steps from a selection to the stored layer (merge, layout, ThinK, quantization),
  and the combinations refused before any prefill (`check_storage`).
- `restkv.storage.layouts`: dense, variable-length and masked layers, and what each costs.
- `restkv.storage.varlen`: attention over variable-length layers.
- `restkv.storage.quantize`: quantized storage of the kept keys and values.
"""
