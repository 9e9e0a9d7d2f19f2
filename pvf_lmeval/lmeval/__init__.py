"""The lm-evaluation-harness adapter: the ``pvf-dlm`` model class and what it needs.

``lm.py`` is the LM subclass (lm-eval's protocol only); ``settings.py`` parses its model args
once, ``planner.py`` turns requests into batches, ``sink.py`` takes the answers; the other
modules are their pieces: the args table, the run identity, the response cache, the processes,
request checks, generated-text handling, statistics totals, launch checks, trace records, and
the helpers the task YAMLs call (task loading, cost metrics, the arith tasks).
"""
