"""The OpenCompass rows' prompts on fields that hold column names in braces.

OpenCompass fills a template with ``safe_format``: ``{name}`` replaced column after column in
the loader's order, the output column blanked (ML-GSAI/LLaDA @ b7e6c35,
``opencompass/openicl/icl_prompt_template.py``, ``utils/prompt.py``; the column orders of
``datasets/arc.py``, ``gpqa.py`` ``GPQADataset_``, ``mmlu.py``, ``mmlu_pro.py`` ``_parse``,
``bbh.py``). Every expected string below was worked out by hand from those rules, step by step
in each test's comment; ``str.format`` leaves these fields as they are, so each test fails
with it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _utils(folder: str):
    spec = importlib.util.spec_from_file_location(f"_oc_fill_{folder}", REPO / "tasks" / folder / "utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_oc_fill_replaces_in_the_given_order_and_leaves_other_braces():
    from pvf_lmeval.lmeval.oc_prompt import oc_fill

    assert oc_fill("{a}|{b}|{c}|{x}", [("a", "{b}{c}"), ("b", 1), ("c", ["{a}"])]) == \
        "1['{a}']|1|['{a}']|{x}"


def test_arc_fills_question_answer_key_then_texts():
    # question -> its text; answerKey -> ""; textA -> "one {textD}"; textB -> "two" (also in
    # \mathbf{textB}); textC -> "three {question}" (question already filled: stays); textD ->
    # "four {answerKey}" (answerKey already filled: stays)
    arc = _utils("arc_llada")
    doc = {"question": "Which is \\mathbf{textB} and {answerKey}x {textC}?", "A": "one {textD}",
           "B": "two", "C": "three {question}", "D": "four {answerKey}", "label": "A"}
    assert arc.doc_to_text_llada_oc(doc) == (
        "Question: Which is \\mathbftwo and x three {question}?\nA. one four {answerKey}\nB. two\n"
        "C. three {question}\nD. four {answerKey}\nAnswer:")


def test_gpqa_fills_question_options_then_blanks_the_answer():
    # question; A -> "$\text{D}$ {D}" (also into \mathbf{A}); B -> "b"; C -> "c {question}";
    # D -> "d" (every {D} so far, \text{D} included); answer -> ""
    gpqa = _utils("gpqa_llada")
    doc = {"question": "Let $\\mathbf{A}$ act on {answer}{B}.", "A": "$\\text{D}$ {D}", "B": "b",
           "C": "c {question}", "D": "d", "answer": "B"}
    tail = ("\nQuestion:\nLet $\\mathbf$\\textd$ d$ act on b.\nChoices:\nA. $\\textd$ d\nB. b\n"
            "C. c {question}\nD. d\nWhen you're ready to answer, please use the format 'The correct "
            "answer is (X)' where X is the correct letter choice from 'ABCD'.")
    five_shot = (REPO / "tasks" / "gpqa_llada" / "llada_oc_five_shot.txt").read_text(encoding="utf-8")
    assert gpqa.doc_to_text_llada_oc(doc) == five_shot + tail


def test_mmlu_fills_input_options_then_the_target_blank_or_letter():
    # input; A -> "2I {B}" (into \mathbf{A}); B -> "{input}" (input already filled: stays);
    # C -> "0"; D -> "I {A}" (A already filled: stays); target -> "" for the question asked,
    # the letter D for an exemplar. An exemplar is then filled again with the asked question's
    # columns (input "Why?", A "alpha", ..., target ""): its surviving {input} and {A} change.
    mmlu = _utils("mmlu_llada")
    doc = {"subject": "college_mathematics", "question": "If \\mathbf{A} = {target}I",
           "choices": ["2I {B}", "{input}", "0", "I {A}"], "answer": 3}
    hint = ("There is a single choice question about college mathematics. Answer the question by "
            "replying A, B, C or D.")
    assert mmlu.doc_to_text_llada_oc(doc) == \
        f"{hint}\nQ: If \\mathbf2I {{input}} = I\nA. 2I {{input}}\nB. {{input}}\nC. 0\nD. I {{A}}\nA: "
    asked = [("input", "Why?"), ("A", "alpha"), ("B", "beta"), ("C", "gamma"), ("D", "delta"),
             ("target", "")]
    assert mmlu.fewshot_to_text_llada_oc({**doc, mmlu.ASKED: asked}) == \
        f"{hint}\nQuestion: If \\mathbf2I Why? = DI\nA. 2I Why?\nB. Why?\nC. 0\nD. I alpha\nAnswer: "


def test_mmlu_pro_fills_the_hub_columns_then_parse_s():
    # question_id (none yet); question; options -> str of the list; answer -> ""; answer_index
    # -> "2"; cot_content -> "c" (prefix removed, stripped); category -> "math"; src -> "s1";
    # answer_string -> "C. z\n"; options_str -> "A. x {question}\nC. z" (N/A left out)
    pro = _utils("mmlu_pro_pvf")
    doc = {"question_id": 7, "question": "Find {options_str}? {answer}{category}|{src}|{question_id}|"
           "{answer_index}|{cot_content}|{answer_string}|{options}",
           "options": ["x {question}", "N/A", "z"], "answer": "C", "answer_index": 2,
           "cot_content": "A: Let's think step by step. c", "category": "math", "src": "s1"}
    assert pro.doc_to_text_llada_oc(doc) == (
        "Answer the following multiple choice question. The last line of your response should be "
        "of the following format: 'ANSWER: $LETTER' (without quotes) where LETTER is one of "
        "Options(e.g. one of ABCDEFGHIJKLMNOP). Think step by step before answering.\n\nQuestion:\n\n"
        "Find A. x {question}\nC. z? math|s1|{question_id}|2|c|C. z\n|['x {question}', 'N/A', 'z']"
        "\n\nOptions:\n\nA. x {question}\nC. z")


def test_bbh_fills_input_then_blanks_the_target_after_the_exemplars_are_set():
    # the exemplars are part of the template before filling; input; target -> ""
    bbh = _utils("bbh_llada")
    doc = {"subtask": "navigate", "input": "Go {target} then {input} and {exemplars}", "target": "Yes"}
    exemplars = (REPO / "tasks" / "bbh_llada" / "lib_prompt" / "navigate.txt").read_text(encoding="utf-8")
    assert bbh.doc_to_text_llada_oc(doc) == (
        f"Follow the given examples and answer the question.\n{exemplars}\n\n"
        "Q: Go  then {input} and {exemplars}\nA: Let's think step by step.")
