"""Planning vocabularies as artifacts: loading, picking and resolving them against a tokenizer
(``vocab.py``), building them by calibration (``calibrate.py``, a step run by the decode loop)
and the online mode's statistics (``online.py``).

Artifacts live here and fixed vocabularies in ``decoding``: an artifact is a file (JSON of token
strings and statistics, tied to a tokenizer and a model family), which needs the file system and
the tokenizer; a decoder needs only the ids it may plan on, as a tensor (``decoding.plan_vocab``).
So this package turns artifacts into ids, and decoding never reads a file.
"""
