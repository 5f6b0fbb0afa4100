"""The documented scripts refuse a wrong setting before they start any server."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys

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


@pytest.mark.parametrize("env, said", [
    ({"SCHEME": "http"}, "SCHEME=http: expected grpc or openai"),
    ({"CONFIG": "nope.yaml"}, "CONFIG=nope.yaml: no such file (or CONFIG=alone)"),
    ({"INTERVALS": "1 0"}, "INTERVALS: 0 is not a stream_interval (an integer >= 1)"),
])
def test_stream_interval_ab_names_a_wrong_setting(tmp_path, env, said):
    work = tmp_path / "work"
    rc, err = _run_script([str(REPO / "scripts" / "stream_interval_ab.sh"), str(work)], env)
    assert (rc, err.strip()) == (2, said)
    assert not work.exists()


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


def _bench_revisions():
    spec = importlib.util.spec_from_file_location("bench_revisions", REPO / "scripts" / "bench_revisions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_revisions_puts_each_runs_sequential_speedups_beside_its_r1_ones():
    """Each column one bench: its R = 1 rows over that run's target alone, and the sequential
    table's speedups pooled over its tasks (Σ none seconds / Σ method seconds), not averaged."""
    def results(none_tps: float, dflash_tps: float, seconds: dict[str, tuple[float, float]]) -> dict:
        return {"concurrency": {"methods": {"none": {"1": {"total_tokens_per_s": none_tps}},
                                            "dflash": {"1": {"total_tokens_per_s": dflash_tps}}}},
                "tasks": {task: {"none": {"seconds": none_s}, "dflash": {"seconds": dflash_s}}
                          for task, (none_s, dflash_s) in seconds.items()}}

    script = _bench_revisions()
    runs = [("aaa", script.rows_of(results(100.0, 170.0, {"code": (10.0, 9.0), "math": (30.0, 6.0)}))),
            ("bbb", script.rows_of(results(120.0, 180.0, {"code": (12.0, 12.0), "math": (28.0, 8.0)})))]
    lines = script.table("aaa", "bbb", runs).splitlines()
    assert "| none | 100.0 tok/s | 120.0 tok/s |" in lines
    assert "| dflash | 1.70× | 1.50× |" in lines
    assert "| dflash (sequential) | 2.67× | 2.00× |" in lines  # 40 / 15 and 40 / 20 (task means: 3.06, 2.25)


@pytest.mark.parametrize("revs, message", [(["HEAD", "HEAD"], "are the same commit"),
                                           (["no-such-rev"], "'no-such-rev' is not a commit")])
def test_bench_revisions_refuses_what_it_cannot_compare_before_any_bench(tmp_path, revs, message):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_revisions.py"), *revs,
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_image_rehearsal_installs_the_images_pins_and_names_a_missing_one(tmp_path):
    from trtspec.gpu.image import CARRIED_WHEELS, IMAGE_PACKAGES, read_pins

    listed = subprocess.run(["bash", str(REPO / "scripts" / "image_rehearsal.sh"), "--requirements"],
                            env={**os.environ, "VENV": str(tmp_path / "no-venv")}, capture_output=True,
                            text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    requirements = listed.stdout.split()
    image = read_pins(IMAGE_PACKAGES)
    for name in ("transformers", "onnxruntime", "onnx", "triton", "safetensors", "tokenizers"):
        assert f"{name}=={image[name]}" in requirements
    assert all(f"{name}=={version}" in requirements for name, version in read_pins(CARRIED_WHEELS).items())
    assert not (tmp_path / "no-venv").exists()  # listing builds nothing
    # a pins file that lost one: the script names the package and the file before installing anything
    (tmp_path / "scripts").mkdir()
    script = REPO / "scripts" / "image_rehearsal.sh"
    (tmp_path / "scripts" / script.name).write_text(script.read_text())
    (tmp_path / "trtspec" / "gpu").mkdir(parents=True)
    (tmp_path / "trtspec" / "gpu" / "wheels.txt").write_text(CARRIED_WHEELS.read_text())
    (tmp_path / "trtspec" / "gpu" / "h200_packages.txt").write_text(
        "".join(line for line in IMAGE_PACKAGES.read_text().splitlines(keepends=True)
                if not line.startswith("onnxruntime==")))
    rc, err = _run_script([str(tmp_path / "scripts" / "image_rehearsal.sh"), "--requirements"],
                          {"VENV": str(tmp_path / "no-venv")})
    assert rc == 2 and "no pin for onnxruntime in trtspec/gpu/h200_packages.txt" in err


def _mutants(cwd, *args: str) -> subprocess.CompletedProcess:
    """scripts/mutants.py run from `cwd` (its module and tests are paths from there)."""
    return subprocess.run([sys.executable, str(REPO / "scripts" / "mutants.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("tests, said", [
    (["tests/test_stop_trimmer.py", "-k", "no_such_test"], "pytest exit status 5"),  # selects none
    (["tests/no_such_file.py"], "pytest exit status 4"),
])
def test_mutants_refuses_tests_that_do_not_pass_on_the_module_as_it_is(tests, said):
    """A mutant counts as killed when the tests fail: tests that select nothing or fail already would
    report every mutant killed, so the script refuses them before trying any, the module untouched."""
    module = REPO / "trtspec" / "openai" / "stops.py"
    before = module.read_text()
    run = _mutants(REPO, "--sample", "1", "--", "trtspec/openai/stops.py", *tests)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"the tests do not pass on trtspec/openai/stops.py as it is ({said})" in run.stderr
    assert "killed" not in run.stdout and module.read_text() == before


def test_mutants_tries_only_the_lines_asked_for(tmp_path):
    """--lines 2,5-6 tries the mutants on lines 2 and 6 (`<` -> `<=`; `+` -> `-`, `1` -> `2`), none on
    line 10's `*`, and reports each against the tests."""
    (tmp_path / "mod.py").write_text("def below(a, b):\n    return a < b\n\n\ndef add(a):\n    return a + 1\n"
                                     "\n\ndef twice(a):\n    return a * 2\n")
    (tmp_path / "test_mod.py").write_text("from mod import add, below, twice\n\n\ndef test_mod():\n"
                                          "    assert not below(2, 2) and add(0) == 1 and twice(3) == 6\n")
    run = _mutants(tmp_path, "--sample", "0", "--lines", "2,5-6", "--", "mod.py", "test_mod.py")
    assert run.returncode == 0, run.stdout + run.stderr
    tried = [line.split("  (")[0].split("] ")[1] for line in run.stdout.splitlines() if line.startswith("[")]
    assert tried == ["killed   line 2: '<' -> '<='", "killed   line 6: '+' -> '-'",
                     "killed   line 6: '1' -> '2'"], run.stdout
