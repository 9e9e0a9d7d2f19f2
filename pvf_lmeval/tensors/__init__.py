"""Tensor helpers shared by the two cores: :mod:`.uploads` (small host values onto the device
without a blocking copy), :mod:`.fixed_order` (sums in one fixed order) and :mod:`.compiling`
(``torch.compile`` under the package's dynamic-shape settings) and :mod:`.shadow` (the model
protocol's shadow block request). ``decoding/`` and ``models/``
may both import this package; they never import each other."""
