"""Few-shot exemplars from the doc's own group, for a task that is one task over many groups.

lm-eval's group tasks (``mmlu_pro``, OpenCompass's per-subject MMLU) give each subject its own
task and its own few-shot pool. :class:`GroupFewshotTask` is ONE task over all of them whose
sampler draws a doc's exemplars from the few-shot split's docs of the same group (the value of
``group_field``), in the split's order: the prompt the group's own subtask builds.
"""

from __future__ import annotations

from collections import defaultdict

from lm_eval.api.task import ConfigurableTask


class GroupFewshotTask(ConfigurableTask):
    """A ConfigurableTask whose few-shot pool is the few-shot split's docs of the doc's group
    (``doc[group_field]``). Subclasses name the field."""

    group_field = "category"

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        self._pools: dict | None = None
        super().__init__(config=config, **kwargs)

    def _pool(self, group: str) -> list:
        if self._pools is None:
            self._pools = defaultdict(list)
            for doc in self.sampler.df:  # the first_n sampler keeps the split's order
                self._pools[doc[self.group_field]].append(doc)
        pool = self._pools.get(group)
        if not pool:
            raise ValueError(f"{self.config.task}: no few-shot ({self.config.fewshot_split}) "
                             f"docs of {self.group_field} {group!r}")
        return pool

    def exemplars(self, doc: dict, pool: list) -> list:
        """The docs the sampler draws ``doc``'s exemplars from: its group's ``pool``, as they
        are (a subclass may give each what the asked ``doc`` adds to its text)."""
        return pool

    def fewshot_context(self, doc, num_fewshot, *args, **kwargs):
        if num_fewshot and hasattr(self, "sampler"):
            all_docs = self.sampler.df
            self.sampler.df = self.exemplars(doc, self._pool(doc[self.group_field]))
            try:
                return super().fewshot_context(doc, num_fewshot, *args, **kwargs)
            finally:
                self.sampler.df = all_docs
        return super().fewshot_context(doc, num_fewshot, *args, **kwargs)
