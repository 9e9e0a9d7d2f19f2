"""What a run prints besides its results: no advice that does not apply to our tasks, no git error
outside a checkout, notices on their own line above the progress bar, and a warning when a
launcher asked for more ranks than the run got."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

from tqdm import tqdm

from pvf_lmeval.lmeval import launch, task_loading
from pvf_lmeval.files.paths import tasks_dir as tasks_path

CUSTOM_KWARGS = ": Custom kwargs can be passed to `--metadata` in console (as json string) or to the TaskManager."


def test_custom_dataset_advice_is_dropped_for_our_tasks_only(caplog):
    task_loading.quiet_custom_dataset_notice(tasks_path() / "gsm8k_pvf")
    task_loading.quiet_custom_dataset_notice(tasks_path() / "gsm8k_pvf")   # idempotent
    logger = logging.getLogger(task_loading.TASK_LOGGER)
    assert logger.filters.count(task_loading._FILTER) == 1
    assert {"gsm8k_pvf", "gsm8k_cot_pvf", "gsm8k_pvf_chat"} <= task_loading.task_names(
        tasks_path() / "gsm8k_pvf")
    with caplog.at_level(logging.WARNING, logger=task_loading.TASK_LOGGER):
        logger.warning("gsm8k_cot_pvf" + CUSTOM_KWARGS)
        logger.warning("someone_elses_task" + CUSTOM_KWARGS)
        logger.warning("gsm8k_cot_pvf: another warning")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["someone_elses_task",
                                                                     "gsm8k_cot_pvf"]


def test_git_probe_is_silent_outside_a_checkout(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    from lm_eval.loggers.utils import get_git_commit_hash

    capfd.readouterr()
    assert get_git_commit_hash() is None
    assert "not a git repository" in capfd.readouterr().err          # lm-eval's own probe
    launch.quiet_git_probe()
    import lm_eval.evaluator as evaluator

    assert evaluator.get_git_commit_hash() is None
    assert capfd.readouterr().err == ""
    # inside a checkout it gives what lm-eval's gives
    subprocess.run(["git", "init", "-q"], check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    assert evaluator.get_git_commit_hash() == get_git_commit_hash() != ""


def test_single_rank_warning_names_the_launch_that_works():
    argv = ["/venv/bin/python", "/venv/bin/accelerate", "launch", "--num_processes", "2", "-m",
            "lm_eval", "--model", "pvf-dlm"]
    assert launch.requested_processes(argv) == 2
    assert launch.requested_processes(["accelerate", "launch", "--num-processes=4", "x.py"]) == 4
    assert launch.requested_processes(["torchrun", "--nproc_per_node", "2", "-m", "lm_eval"]) is None
    assert launch.requested_processes(["accelerate", "launch", "-m", "lm_eval"]) is None
    msg = launch.single_rank_warning(1, argv)
    assert msg.startswith("pvf-dlm: accelerate launch asked for 2 processes but this run has 1 rank")
    assert "--multi_gpu --num_processes 2" in msg and "torchrun --nproc_per_node 2" in msg
    assert "\n" not in msg
    assert launch.single_rank_warning(2, argv) is None                 # it got its ranks
    assert launch.single_rank_warning(1, ["bash"]) is None
    assert launch.single_rank_warning(1) is None                       # pytest's parent: no launcher


def test_notice_goes_above_the_progress_bar(capsys):
    from pvf_lmeval.lmeval.lm import _notice, log

    handler = logging.StreamHandler(sys.stderr)
    log.addHandler(handler)
    try:
        bar = tqdm(total=3, file=sys.stderr, desc="pvf-dlm", mininterval=0)
        bar.update(1)
        _notice("pvf-dlm: a notice")
        bar.update(1)
        bar.close()
    finally:
        log.removeHandler(handler)
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.split("\n") if "a notice" in ln]
    assert line.split("\r")[-1] == "pvf-dlm: a notice"       # the bar was cleared first
    assert re.search(r"pvf-dlm: a notice\n.*2/3", err)         # and drawn again below it
