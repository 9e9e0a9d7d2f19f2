"""Planning vocabularies: artifacts (``vocab.py``), calibration (``calibrate.py``) and the
online mode's bookkeeping (``online.py``). The decoders see only the resolved token ids."""
