# pvf-lmeval: make venv | demo | test | clean
# Everything runs on CPU and offline once the environment exists.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
# Re-install (editable) only when packaging inputs change; the .pth hook and its module
# are copied into site-packages, so edits to them need a re-install too.
STAMP  := $(VENV)/.pvf-lmeval-installed
INSTALL_INPUTS := pyproject.toml pvf_lmeval/__init__.py $(addprefix pvf_lmeval/_site_hook/,pvf_lmeval_hook.py pvf_lmeval_hook.pth hatch_build.py)

.PHONY: venv demo test browser clean distclean active-env-incomplete

venv: $(STAMP)

# make demo / make test run in the active environment, the one of $(PYTHON) on PATH (an activated
# venv or conda environment puts its own first), when it has this checkout's package installed
# editable (pip install -e .) with what the goal needs (make test: the test and plot extras);
# otherwise in $(VENV), built on first use. USE_VENV=1 always uses $(VENV).
# scripts/active_env.py decides, says so in one line, and stops the goal when that environment
# has this checkout's package but lacks something (it names it).
ENV_GOALS := $(filter demo test,$(MAKECMDGOALS))
ACTIVE_PY :=
ifneq ($(ENV_GOALS),)
ifeq ($(USE_VENV),)
ACTIVE_PY := $(shell $(PYTHON) scripts/active_env.py --venv $(VENV) --goals $(ENV_GOALS) --inputs $(INSTALL_INPUTS))
endif
endif
ifeq ($(ACTIVE_PY),)
RUN_PY  := $(PY)
RUN_ENV := venv
else ifeq ($(ACTIVE_PY),missing)
RUN_PY  := $(PY)
RUN_ENV := active-env-incomplete
else
RUN_PY  := $(ACTIVE_PY)
RUN_ENV :=
endif

# the line saying what is missing came from scripts/active_env.py
active-env-incomplete:
	@exit 1

# pip's output goes to $(VENV)/install.log (its tail is shown if the install fails): what a
# newcomer should see from `make demo` is the results table.
$(STAMP): $(INSTALL_INPUTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "pvf-lmeval: installing torch==2.13.0 (if missing) and the package into $(VENV) (log: $(VENV)/install.log)"
	@{ $(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install "torch==2.13.0"; } > $(VENV)/install.log 2>&1 \
	  && $(PY) -m pip install -e ".[test,plot]" >> $(VENV)/install.log 2>&1 \
	  || { tail -n 30 $(VENV)/install.log; echo "pvf-lmeval: install failed (full log: $(VENV)/install.log)"; exit 1; }
	@touch $@

demo: $(RUN_ENV)
	@echo "pvf-lmeval: lm_eval --model pvf-dlm on tiny-llada, task arith, 200 items"
	@$(OFFLINE) "$(RUN_PY)" -m lm_eval --model pvf-dlm \
		--model_args pretrained=tiny-llada,decoder=threshold \
		--include_path tasks --tasks arith --limit 200

# Random test order (pytest-randomly) and a per-test timeout (pytest-timeout, pyproject.toml);
# PYTEST_ARGS="--randomly-seed=N" reruns an order, "-p no:randomly" the file order.
# Two worker processes (pytest-xdist), each test file whole on one of them (--dist loadfile:
# a file's module fixtures run once); TEST_WORKERS=0 runs in this process.
TEST_WORKERS ?= 2
# Without chromium and chromedriver the browser test skips, saying so in one line first (`make
# browser` installs them; under CI=true it fails instead, tests/helpers/prerequisites.py).
comma       := ,
HAS_BROWSER := $(shell { command -v chromium || command -v chromium-browser; } >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && echo yes)
NO_BROWSER  := PVF_ALLOW_MISSING=$(if $(PVF_ALLOW_MISSING),$(PVF_ALLOW_MISSING)$(comma))browser
test: $(RUN_ENV)
	@$(if $(HAS_BROWSER),:,echo "pvf-lmeval: no chromium/chromedriver, so the browser test (tests/test_trace.py) is skipped; make browser installs them")
	$(OFFLINE) $(if $(HAS_BROWSER),,$(NO_BROWSER)) "$(RUN_PY)" -m pytest -q tests $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) $(PYTEST_ARGS)

# chromium and chromedriver for the browser test (apt-get, as root or through sudo)
browser:
	scripts/install_browser.sh

clean:
	rm -rf build dist .pytest_cache *.egg-info
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)

# Planning vocabularies: calibrate both tiny fixtures on the arith_var calibration split (400
# prompts, gen length 256: the task whose sentence openings are uncertain; the paper's filters;
# resumable: an interrupted run continues from vocab_artifacts/*.partial) and rewrite the
# uncalibrated heuristic artifacts of LLaDA-8B-Instruct / Dream-7B-Instruct.
CALIBRATE := $(OFFLINE) $(VENV)/bin/pvf-calibrate --data arith_var --family math-word \
	--gen-length 256 --block-length 32 --threads 1 --batch-size 8 --width 64
.PHONY: vocab
vocab: venv
	$(CALIBRATE) --model tiny-llada --out vocab_artifacts/tiny-llada.math-word.calibrated.json
	$(CALIBRATE) --model tiny-dream --out vocab_artifacts/tiny-dream.math-word.calibrated.json
	$(PY) scripts/make_heuristic_vocab.py

# Decoders x thresholds on tiny-llada / arith through the lm_eval CLI, then pvf-report: the
# leaderboard and the accuracy-NFE Pareto plot in out/sweep/ (SWEEP_ARGS="--limit 50 ...").
.PHONY: sweep
sweep: venv
	$(OFFLINE) $(PY) bench/sweep.py --out out/sweep $(SWEEP_ARGS)
