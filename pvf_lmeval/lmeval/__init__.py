"""The lm-evaluation-harness adapter: the ``pvf-dlm`` model class and what it needs.

``lm.py`` is the LM subclass (arguments, batching, chat template, statistics); the other modules
are its pieces: request checks, generated-text handling, statistics totals, launch checks, trace
records, and the helpers the task YAMLs call (task loading, cost metrics, the arith tasks).
"""
