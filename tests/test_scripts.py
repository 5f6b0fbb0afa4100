"""The documented scripts refuse a wrong setting before they start any server."""

from __future__ import annotations

import os
import signal
import subprocess

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
