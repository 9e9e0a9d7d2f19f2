"""Loading the package's task YAMLs quietly.

lm-eval 0.4.13 warns "<task>: Custom kwargs can be passed to `--metadata` ..." for every task whose
data comes from a ``custom_dataset`` function, which is how our tasks read their local files (and
choose between the hub and ``pvf-data fetch`` copies). Those functions take no such kwargs, so the
advice is wrong for them: :func:`quiet_custom_dataset_notice` drops that one warning for the tasks
defined next to the calling ``utils.py``, and for no other task.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

#: the logger lm-eval's ``Task.download`` warns through
TASK_LOGGER = "lm_eval.api.task"
NOTICE = ": Custom kwargs can be passed to `--metadata`"
_TASK_LINE = re.compile(r"^task:\s*([\w.\-]+)\s*$", re.MULTILINE)


class _DropCustomKwargsNotice(logging.Filter):
    def __init__(self):
        super().__init__()
        self.tasks: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        head, sep, _ = msg.partition(NOTICE)
        return not (sep and head in self.tasks)


_FILTER = _DropCustomKwargsNotice()


def task_names(folder: Path) -> set[str]:
    """The ``task:`` names of the YAML files in ``folder``."""
    names = set()
    for path in Path(folder).iterdir():
        if path.suffix == ".yaml" or path.name.endswith("_yaml"):
            names.update(_TASK_LINE.findall(path.read_text(encoding="utf-8")))
    return names


def quiet_custom_dataset_notice(folder) -> None:
    """Drop lm-eval's custom-dataset warning for the tasks defined in ``folder`` (idempotent)."""
    _FILTER.tasks |= task_names(Path(folder))
    logger = logging.getLogger(TASK_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
