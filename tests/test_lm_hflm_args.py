"""HFLM's model args and chat-template habits on ``pvf-dlm``: ``revision``, ``tokenizer``,
``add_bos_token``, ``max_length``, ``max_batch_size`` with a fixed batch size, named chat
templates and the retry without the system role, and every per-request decoding parameter in
``config.pvf``. Each test quotes what HFLM (``lm_eval/models/huggingface.py``) does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.edited_folders import edit_json
from helpers.prerequisites import require_bundled_weights

pytest.importorskip("lm_eval")

REPO = Path(__file__).resolve().parents[1]
BOS = 685          # tiny-llada's <|startoftext|>


def _lm(**kw):
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    require_bundled_weights("tiny-llada")
    return PVFDiffusionLM(**{"pretrained": "tiny-llada", "device": "cpu", "gen_length": 32, **kw})


def _gen(context: str, **gen_kwargs):
    from lm_eval.api.instance import Instance

    return Instance(request_type="generate_until", doc={}, idx=0, metadata=("arith", 0, 1),
                    arguments=(context, {"until": ["Question:"], **gen_kwargs}))


def _copy_fixture(tmp_path: Path, name: str = "tiny-llada") -> Path:
    from pvf_lmeval.models.loader import FIXTURES_DIR

    folder = tmp_path / f"{name}-copy"
    shutil.copytree(FIXTURES_DIR / name, folder)
    return folder


def _set_templates(folder: Path, templates) -> None:
    edit_json(folder / "tokenizer_config.json", {"chat_template": templates})


def _spy_prompts(lm, monkeypatch) -> list:
    """The prompt ids of every decoded request."""
    import pvf_lmeval.lmeval.lm as lm_mod

    seen, real = [], lm_mod.decode_batch

    def spy(model, prompts, *a, **k):
        seen.extend(list(map(int, p)) for p in prompts)
        return real(model, prompts, *a, **k)
    monkeypatch.setattr(lm_mod, "decode_batch", spy)
    return seen


def test_max_batch_size_with_a_fixed_batch_size_is_accepted():
    """HFLM: ``max_batch_size``, "upper bound for batch size when using automatic batch size
    detection"; lm-eval's CLI passes it with every ``--batch_size``."""
    from pvf_lmeval.lmeval.lm import PVFDiffusionLM

    lm = PVFDiffusionLM.create_from_arg_string(
        "pretrained=tiny-llada,gen_length=32", {"batch_size": 4, "max_batch_size": 8, "device": "cpu"})
    assert lm.batch_size == 4 and lm.get_model_info()["pvf"]["batch_size"] == 4


def test_revision_reaches_the_hub_and_is_noted_for_a_folder(tmp_path, monkeypatch, caplog):
    """HFLM passes ``revision`` to ``from_pretrained`` for the model and its tokenizer; a local
    folder has no revisions (transformers ignores it there)."""
    import huggingface_hub

    other = _copy_fixture(tmp_path)
    _set_templates(other, "{{ 'revision v2' }}")
    asked = []

    def snapshot(repo_id, revision=None, **kw):
        asked.append((repo_id, revision))
        return str(other if revision == "v2" else _copy_fixture(tmp_path / "main"))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    lm = _lm(pretrained="owner/tiny", revision="v2")
    assert asked == [("owner/tiny", "v2")]
    assert lm.tokenizer.chat_template == "{{ 'revision v2' }}"
    assert lm.get_model_info()["pvf"]["revision"] == "v2"
    _lm(revision="v2")
    assert any("revision=v2 is for hub ids; pretrained=tiny-llada is a local or bundled folder"
               in r.getMessage() for r in caplog.records)


def test_tokenizer_is_read_from_its_own_folder(tmp_path):
    """HFLM: ``tokenizer``, "Tokenizer to use for encoding inputs ... defaults to the tokenizer
    associated with pretrained"."""
    folder = _copy_fixture(tmp_path)
    _set_templates(folder, "{{ 'own tokenizer' }}")
    (folder / "model.safetensors").unlink()               # a tokenizer folder, no weights
    lm = _lm(tokenizer=str(folder))
    assert lm.tokenizer.chat_template == "{{ 'own tokenizer' }}"
    assert lm.get_model_info()["pvf"]["tokenizer"] == str(folder)


def test_add_bos_token_starts_every_context_with_bos(monkeypatch):
    """HFLM: ``add_bos_token``, "whether to prepend the beginning-of-sequence token to inputs";
    its ``tok_encode`` adds none to a string that already starts with it."""
    from lm_eval.api.instance import Instance

    lm = _lm(add_bos_token=True)
    seen = _spy_prompts(lm, monkeypatch)
    plain = lm.tokenizer.encode("Question: 1 + 2?\nAnswer:", add_special_tokens=False)
    lm.generate_until([_gen("Question: 1 + 2?\nAnswer:"), _gen("<|startoftext|>Question: 1 + 2?\nAnswer:")],
                      disable_tqdm=True)
    assert seen == [[BOS, *plain], [BOS, *plain]]
    ctx, cont = lm.prompts.pair("Question: 1 + 2?\nAnswer:", " 3")
    assert ctx == [BOS, *plain] and cont == lm.tokenizer.encode(" 3", add_special_tokens=False)
    req = Instance(request_type="loglikelihood", doc={}, idx=0, metadata=("t", 0, 1),
                   arguments=("Question: 1 + 2?\nAnswer:", " 3"))
    assert lm.loglikelihood([req], disable_tqdm=True) == _lm(add_bos_token=True).loglikelihood(
        [req], disable_tqdm=True)
    default = _lm()
    seen.clear()
    default.generate_until([_gen("Question: 1 + 2?\nAnswer:")], disable_tqdm=True)
    assert seen == [plain]


def test_max_length_is_the_context(monkeypatch, caplog):
    """HFLM: ``max_length``, "maximum input sequence length in tokens"; prompts are left-cut to
    it minus the generation's tokens."""
    lm = _lm(max_length=48)
    seen = _spy_prompts(lm, monkeypatch)
    prompt = "Question: " + "one two three " * 10 + "?\nAnswer:"
    lm.generate_until([_gen(prompt)], disable_tqdm=True)
    assert len(seen[0]) == 48 - 32
    assert seen[0] == lm.tokenizer.encode(prompt, add_special_tokens=False)[-16:]
    info = lm.get_model_info()["pvf"]
    assert info["totals"]["arith"]["truncated_prompts"] == 1 and info["max_length"] == 48
    assert any("context of 48 tokens" in r.getMessage() for r in caplog.records)


NAMED = [{"name": "default", "template": "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"},
         {"name": "plain", "template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                       "{% endfor %}"}]
NO_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}"
             "{{ raise_exception('System role not supported') }}{% endif %}"
             "<{{ m['role'] }}>{{ m['content'] }}{% endfor %}")


def _prompts_of(folder: Path, tmp_path: Path, **kw) -> list[str]:
    """The prompts of two arith items run through simple_evaluate with a chat template (the CLI
    path: an EvaluationTracker makes lm-eval ask the model for the template first)."""
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model=_lm(pretrained=str(folder)), tasks=["arith"], limit=2,
                          task_manager=TaskManager(include_path=str(REPO / "tasks"),
                                                   include_defaults=False),
                          evaluation_tracker=EvaluationTracker(output_path=str(tmp_path / "o")),
                          bootstrap_iters=0, **kw)
    return [s["arguments"][0][0] for s in out["samples"]["arith"]]


def test_a_named_chat_template_is_the_one_applied(tmp_path):
    """HFLM (``TemplateLM.chat_template``): with named templates ``--apply_chat_template NAME``
    selects NAME, a bare flag ``default``, an unknown name is an error listing the names. HFLM
    only logs the named one; pvf-dlm also applies it."""
    folder = _copy_fixture(tmp_path)
    _set_templates(folder, NAMED)
    plain = _prompts_of(folder, tmp_path, apply_chat_template="plain")
    assert all(p.startswith("user: Question: ") and p.endswith("\n") for p in plain)
    default = _prompts_of(folder, tmp_path, apply_chat_template=True)
    assert all(p.startswith("[Question: ") and p.endswith("]") for p in default)
    with pytest.raises(ValueError) as exc:
        _prompts_of(folder, tmp_path, apply_chat_template="chatml")
    assert "'chatml' is not available" in str(exc.value) and "['default', 'plain']" in str(exc.value)
    assert getattr(exc.value, "pvf_one_line", False)


def test_a_template_that_rejects_the_system_role_is_retried_without_it(tmp_path, caplog):
    """HFLM's ``apply_chat_template``: on jinja2's ``TemplateError`` it warns "Failed to apply
    chat template. removing the system role in chat history." and renders the rest."""
    folder = _copy_fixture(tmp_path)
    _set_templates(folder, NO_SYSTEM)
    prompts = _prompts_of(folder, tmp_path, apply_chat_template=True,
                          system_instruction="Answer briefly.")
    assert all(p.startswith("<user>Question: ") and "Answer briefly." not in p for p in prompts)
    assert any("removing the system role" in r.getMessage() for r in caplog.records)


def test_every_per_request_parameter_is_recorded(monkeypatch):
    """HFLM applies each request's ``gen_kwargs`` to its ``generate`` call; pvf-dlm records in
    ``config.pvf.task_params`` every decoding parameter a task's requests ran with where it
    differs from the run's ``params`` (a per-request temperature included)."""
    lm = _lm(seed=3)
    lm.generate_until([_gen("Question: 1 + 2?\nAnswer:", temperature=0.5, do_sample=True),
                       _gen("Question: 2 + 2?\nAnswer:", temperature=0.7, do_sample=True,
                            threshold=0.8, top_p=0.95)], disable_tqdm=True)
    info = lm.get_model_info()["pvf"]
    assert info["params"]["temperature"] == 0 and info["params"]["threshold"] == 0.9
    # arith's requests run with its preset (reveal_next 5), then their own kwargs
    assert info["task_params"] == {"arith": {"preset": "arith", "reveal_next": 5,
                                             "temperature": [0.5, 0.7], "threshold": 0.8,
                                             "top_p": 0.95}}
    assert lm.get_model_info()["pvf"]["task_params"] == {}      # the next evaluation's own
