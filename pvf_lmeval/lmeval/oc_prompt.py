"""OpenCompass's prompt filling, for the task YAMLs that reproduce its rows (``*_llada_oc``).

OpenCompass (``PromptTemplate.generate_item`` / ``generate_ice_item``, ``utils/prompt.py``
``safe_format``, ML-GSAI/LLaDA @ b7e6c35) fills a template with the dataset row by replacing
``{name}`` with the column's ``str()``, one column after another in the loader's column order,
the output column blanked for the question asked. A field's text is searched for the names
that come after it, so a question holding ``\\mathbf{A}`` gets option A's text there, and
other braces stay as they are. ``str.format`` differs on exactly those rows.
"""

from __future__ import annotations

from typing import Iterable


def oc_fill(template: str, columns: Iterable[tuple[str, object]]) -> str:
    """``template`` with each ``{name}`` of ``columns`` (name, value) replaced by ``str(value)``,
    in the given order (OpenCompass's ``safe_format``)."""
    for name, value in columns:
        template = template.replace("{" + name + "}", str(value))
    return template
