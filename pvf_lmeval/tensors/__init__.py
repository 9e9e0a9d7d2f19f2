"""Tensor helpers shared by the two cores: :mod:`.uploads` (small host values onto the device
without a blocking copy) and :mod:`.fixed_order` (sums in one fixed order). ``decoding/`` and
``models/`` may both import this package; they never import each other."""
