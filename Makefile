# pvf-lmeval: make venv | demo | test | clean
# Everything runs on CPU and offline once the venv exists.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# Re-install (editable) only when packaging inputs change; the .pth hook and its module
# are copied into site-packages, so edits to them need a re-install too.
STAMP  := $(VENV)/.pvf-lmeval-installed
INSTALL_INPUTS := pyproject.toml pvf_lmeval/__init__.py $(addprefix pvf_lmeval/_site_hook/,pvf_lmeval_hook.py pvf_lmeval_hook.pth hatch_build.py)

.PHONY: venv demo test clean distclean

venv: $(STAMP)

$(STAMP): $(INSTALL_INPUTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"
	$(PY) -m pip install -e ".[test,plot]"
	touch $@

demo: venv
	$(OFFLINE) $(VENV)/bin/lm_eval --model pvf-dlm \
		--model_args pretrained=tiny-llada,decoder=threshold \
		--include_path tasks --tasks arith --limit 200

test: venv
	$(OFFLINE) $(PY) -m pytest -q tests

clean:
	rm -rf build dist .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
