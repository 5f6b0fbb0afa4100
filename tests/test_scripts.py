"""The documented scripts refuse a wrong setting before they start any server."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess

import pytest

from .conftest import REPO


def _run_script(args: list[str], env: dict[str, str], timeout_s: float = 30) -> tuple[int, str]:
    """(exit status, stderr); on a timeout the script's whole process group (servers included) stops."""
    proc = subprocess.Popen(["bash", *args], cwd=REPO, env={**os.environ, **env}, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate()
        raise AssertionError(f"still running after {timeout_s} s: {err[-2000:]}") from None
    return proc.returncode, err


def test_lm_eval_check_names_an_lm_eval_that_is_not_there(tmp_path):
    work, lm_eval = tmp_path / "work", tmp_path / "no-venv" / "lm_eval"
    rc, err = _run_script([str(REPO / "scripts" / "lm_eval_check.sh"), str(work)], {"LM_EVAL": str(lm_eval)})
    assert rc == 2
    assert f"LM_EVAL={lm_eval} is not an executable lm_eval" in err
    assert not work.exists()  # nothing built, no server started


def test_lm_eval_tasks_stops_when_the_held_out_pool_is_spent(monkeypatch):
    """More problems than distinct held-out ones exist: a message naming --count, not a loop that
    never ends (here the pool is made to look spent after 3 draws in a row give nothing new)."""
    spec = importlib.util.spec_from_file_location("lm_eval_tasks", REPO / "scripts" / "lm_eval_tasks.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    assert len(tasks.documents(20, seed=1)) == 20
    monkeypatch.setattr(tasks, "MAX_MISSES", 3)
    monkeypatch.setattr(tasks, "_is_heldout", lambda question: question.endswith("0"))  # a small pool
    with pytest.raises(SystemExit, match=r"--count 100000: found only \d+ distinct held-out problems"):
        tasks.documents(100_000, seed=1)
