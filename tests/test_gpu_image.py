"""The GPU run works on the H200 image as it is: its package set, the carried wheels, and the whole
`scripts/gpu_check.sh --small` rehearsed on the CPU by a Python that imports like the image.

`tests/image_guard/sitecustomize.py` puts trtspec.gpu.image's import guard in place at start-up of
any Python given that folder on PYTHONPATH: trtspec's code (and the carried packages') may import
only the standard library of Python 3.12, the image's distributions and the carried wheels.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from trtspec.gpu.image import CARRIED_WHEELS, IMAGE_PACKAGES, MAX_WHEEL_BYTES, check_wheels, main, read_pins

REPO = Path(__file__).resolve().parents[1]
GUARD_DIR = REPO / "tests" / "image_guard"


def _guarded_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=f"{GUARD_DIR}{os.pathsep}{REPO}", **extra)
    env.pop("TRITON_INTERPRET", None)  # gpu_check --small sets it itself, as it must on a CPU
    return env


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_image_list_is_sourced_and_lacks_what_travels():
    header = IMAGE_PACKAGES.read_text().split("\n\n")[0]
    assert "KINDS.md" in header and "2026-11-17" in header
    image, carried = read_pins(IMAGE_PACKAGES), read_pins(CARRIED_WHEELS)
    assert image["torch"] == "2.11.0" and image["transformers"] == "5.17.0" and image["numpy"] == "2.5.2"
    assert "pydantic" not in image and "tritonclient" not in image and "tensorrt" not in image
    assert "xgrammar" not in image
    assert set(carried) == {"pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                            "typing-extensions", "xgrammar", "apache-tvm-ffi"}
    assert all(carried.values()), "every carried wheel is pinned"


def _assert_planted_import_refused(tmp_path: Path, module: str) -> dict[str, str]:
    """A first-party module `planted` importing `module` fails under the guard, naming both; returns
    the guarded environment."""
    (tmp_path / "planted.py").write_text(f"import {module}\n")
    env = _guarded_env(tmp_path, TRTSPEC_IMAGE_FIRST_PARTY="planted")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    refused = _python("import planted", env)
    assert refused.returncode != 0
    assert f"No module named '{module}' on the GPU image: imported by planted" in refused.stderr
    return env


def test_guard_refuses_a_planted_import_of_a_package_the_image_lacks(tmp_path):
    # tritonclient is installed here (a trtspec dependency) but not on the image
    env = _assert_planted_import_refused(tmp_path, "tritonclient")
    control = dict(env, PYTHONPATH=f"{REPO}{os.pathsep}{tmp_path}")  # the same import without the guard
    assert _python("import planted", control).returncode == 0


def test_guard_needs_every_requirement_of_a_carried_wheel(tmp_path):
    short = tmp_path / "wheels.txt"
    short.write_text("".join(line + "\n" for line in CARRIED_WHEELS.read_text().splitlines()
                             if not line.startswith("annotated-types")))
    refused = _python("import trtspec.config", _guarded_env(tmp_path, TRTSPEC_IMAGE_WHEELS=str(short)))
    assert refused.returncode != 0
    assert "No module named 'annotated_types' on the GPU image: imported by pydantic" in refused.stderr
    assert _python("import trtspec.config", _guarded_env(tmp_path)).returncode == 0


def _wheel(folder: Path, filename: str, requires: list[str]) -> None:
    name, version = filename.split("-")[:2]
    with zipfile.ZipFile(folder / filename, "w") as z:
        meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
        z.writestr(f"{name}-{version}.dist-info/METADATA",
                   "\n".join(meta + [f"Requires-Dist: {r}" for r in requires]) + "\n\nlong description\n")


def _lists(tmp_path: Path, carried: str, image: str = "torch\n") -> tuple[Path, Path, Path]:
    """(image list, carried list, empty wheel folder) of a check_wheels case, the lists as given."""
    (tmp_path / "image.txt").write_text(image)
    (tmp_path / "wheels.txt").write_text(carried)
    (tmp_path / "whl").mkdir()
    return tmp_path / "image.txt", tmp_path / "wheels.txt", tmp_path / "whl"


def test_check_wheels_names_each_missing_requirement(tmp_path):
    image, pins, folder = _lists(tmp_path, "demo==1.0\n", image="# test image\ntorch==2.11.0\nclick\n")
    _wheel(folder, "demo-1.0-py3-none-any.whl",
           ["torch>=2.4", "click", "needed>=1", 'tzdata; platform_system == "Windows"',
            'email-validator>=2; extra == "email"'])
    assert check_wheels(folder, image, pins) == [
        "demo-1.0-py3-none-any.whl requires needed>=1, which is neither carried nor on the image"]

    pins.write_text("demo==1.0\nneeded==1.2\n")
    _wheel(folder, "needed-1.2-cp312-cp312-manylinux_2_17_x86_64.whl", ["torch>=3"])
    assert check_wheels(folder, image, pins) == [
        "needed-1.2-cp312-cp312-manylinux_2_17_x86_64.whl requires torch>=3, "
        "but torch 2.11.0 is what the image would get"]

    _wheel(folder, "needed-1.3-cp311-cp311-win_amd64.whl", [])
    problems = check_wheels(folder, image, pins)
    assert any("two wheels of needed" in p for p in problems)
    assert any("needed-1.3-cp311-cp311-win_amd64.whl: not for CPython 3.12" in p for p in problems)


def test_carried_wheels_install_on_the_image_when_downloaded():
    folder = REPO / ".whl"
    if not any(folder.glob("*.whl")):
        pytest.skip("no .whl/ here: bash scripts/gpu_wheels.sh downloads it (needs the package index)")
    assert check_wheels(folder) == []


def test_gpu_check_script_rehearses_on_cpu_with_image_packages_only(tmp_path):
    """The whole scripts/gpu_check.sh --small, every import through the guard; TensorRT is absent
    (reported as skipped), graphs are CPU-skipped with a reason, everything else runs."""
    log = tmp_path / "refused.log"
    env = _guarded_env(tmp_path, PYTHON=sys.executable, TRTSPEC_IMAGE_GUARD_LOG=str(log))
    env.pop("OUT", None)
    out = tmp_path / "out"
    # a budget no slow machine reaches: the small sweep is seconds, and a cut sweep has no projections
    run = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--small", "--models", "qwen3-8b",
                          "--budget-s", "600", "--out", str(out)], env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "Error in sitecustomize" not in run.stdout + run.stderr
    # one cost model for all the parity pipelines (fp32, bf16, fp16), at most (an earlier test of
    # this session may have measured it): one per dtype ran the rehearsal past the script's timeout
    assert (run.stdout + run.stderr).count("measuring this machine's cost model") <= 1
    # the guard saw the run: the engine check's `import tensorrt` went through it and was refused
    assert "tensorrt __main__" in log.read_text().splitlines()
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.json", "gpu_check.log", "gpu_check.md"]
    report = json.loads((out / "gpu_check.json").read_text())
    rows = {r["check"]: r for r in report["rows"]}
    assert all(r["ok"] for r in report["rows"]), [r for r in report["rows"] if not r["ok"]]
    assert rows["TensorRT engines (engine flavour)"]["detail"] == "skipped: TensorRT not installed"
    assert any(name.startswith("kv_injection_attention[triton]") for name in rows)
    assert {f"DFlash greedy == target alone (cpu {d})" for d in ("fp32", "bf16", "fp16")} <= set(rows)
    assert rows["coupled_argmax 64 rows V1000"]["detail"] == "64/64 rows pick the torch reference's token"
    coupled = rows["DFlash Gumbel-coupled sampling at R = 4 == target alone (cpu)"]["detail"]
    assert coupled.startswith("2/2 seeded samples identical; ")
    penalized = rows["DFlash greedy under penalties at R = 4 == target alone (cpu)"]["detail"]
    assert penalized.startswith("2/2 prompts identical (every other one penalized); ")
    for label in ("DFlash greedy under guides", "DFlash tree greedy under guides"):  # xgrammar travels
        guided = rows[f"{label} at R = 4 == target alone (cpu)"]["detail"]
        assert guided.startswith("2/2 prompts identical (every other one guided); "), guided
    applied = rows["guide bitmask applied to 16 x V151936 logits (cpu)"]["detail"]
    assert "GB/s of logits and bitmask" in applied
    # every parity row of the speculative loop drafted and had drafts accepted (they are in the json)
    assert all(r["accepted"] > 0 for r in report["rows"] if "== target alone" in r["check"])
    for label in ("DFlash greedy", "DFlash tree greedy"):
        audited = rows[f"{label}, padded steps under a capture audit (cpu fp32)"]["detail"]
        assert audited.startswith("4/4 prompts == packed;") and "replays audited: no problems" in audited
    profile = report["synthetic"]["qwen3-8b"]
    assert profile["scale_label"] == "SMALL scaled-down shape" and profile["device"] == "cpu"
    assert profile["cuda_graphs"].startswith("skipped: CUDA graphs need a CUDA device")
    assert profile["target_forward"] and profile["draft"] and profile["plugins"] and not profile["skipped"]
    assert profile["capture_audit"] == {"target forward": [], "draft step": [], "serving padded step": []}
    tasks = [p["task"] for p in profile["projections"][:5]]
    assert tasks == ["GSM8K", "MATH500", "HumanEval", "MBPP", "MT-Bench"]
    markdown = (out / "gpu_check.md").read_text()
    trt_row = "| TensorRT engines (engine flavour) | - |  |  | yes | skipped: TensorRT not installed |"
    assert trt_row in markdown
    assert "### qwen3-8b on cpu (float32, SMALL scaled-down shape)" in markdown


def test_cost_curves_get_what_the_run_has_left_after_the_checks():
    """On a GPU the parity checks' time comes out of the cost curves' budget, so the run ends
    within scripts/gpu_check.sh's timeout; never below 30 s, and the CPU rehearsal keeps its own."""
    from trtspec.gpu_check import PROFILE_MARGIN_S, RUN_SECONDS, profile_budget

    assert profile_budget(None, False, 60.0) == 300.0
    assert profile_budget(None, False, 200.0) == RUN_SECONDS - 200.0 - PROFILE_MARGIN_S
    assert profile_budget(120.0, False, 200.0) == 120.0
    assert profile_budget(None, False, 430.0) == 30.0
    assert profile_budget(None, True, 1000.0) == 30.0 and profile_budget(600.0, True, 1000.0) == 600.0


def test_a_run_stopped_by_the_scripts_timeout_keeps_what_it_measured(tmp_path):
    """scripts/gpu_check.sh stops gpu_check with SIGTERM at 470 s (the device call itself ends at
    540): the cost-curve rows measured until then are in the files, marked partial, with a row that
    says the run was stopped. Here: the small profile, stopped after its first measurement."""
    code = ("import sys, torch; from pathlib import Path; from trtspec.gpu_check import Run, execute; "
            "execute(Run(torch.device('cpu'), True, Path(sys.argv[1])), [], ['qwen3-8b'], 600.0)")
    env = dict(os.environ, PYTHONPATH=str(REPO), TRITON_INTERPRET="1")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    report, waited = tmp_path / "gpu_check.json", time.monotonic() + 600
    try:
        while proc.poll() is None and time.monotonic() < waited:
            if report.is_file() and json.loads(report.read_text())["synthetic"].get("qwen3-8b", {}).get(
                    "target_forward"):
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the profile ended before it could be stopped: " + proc.stdout.read()
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output[-3000:]
    rows = json.loads(report.read_text())["rows"]
    assert rows[-1]["check"] == "run" and not rows[-1]["ok"]
    assert rows[-1]["detail"].startswith("stopped by SIGTERM after ")
    profile = json.loads(report.read_text())["synthetic"]["qwen3-8b"]
    assert profile["target_forward"] and profile["partial"].endswith("measurement(s) not run yet")
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert "### qwen3-8b on cpu (float32, SMALL scaled-down shape)" in markdown
    assert "**Partial: written while the profile ran" in markdown
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu_check.json", "gpu_check.md"]


def test_parity_pipelines_share_one_cost_model(tmp_path):
    """The parity checks' tiny DFlash pipelines (fp32, bf16, fp16, each device) would each measure an
    adaptive-speculation cost model on first use, the cache being keyed by dtype: three of them
    took the CPU rehearsal past the script's timeout. The first one's table serves them all."""
    from trtspec.bench.loop_overhead import tiny_pipeline
    from trtspec.gpu_check import Run
    from trtspec.spec.schedule import SPSTable

    run = Run(torch.device("cpu"), True, tmp_path)
    cpu = torch.device("cpu")
    fp32, bf16, fp16 = (tiny_pipeline(cpu, dtype=d) for d in ("float32", "bfloat16", "float16"))
    fp32.cost_table = SPSTable(batch_tokens=[1, 2], steps_per_s=[100.0, 90.0], machine="given here")
    run.share_cost_table(fp32, bf16)
    run.share_cost_table(fp16)
    assert bf16.cost_table is fp32.cost_table and fp16.cost_table is fp32.cost_table


def test_a_rerun_can_skip_the_parity_checks(tmp_path):
    """What is left of the device time after a full run (15 minutes in all, a start costing one or
    two) holds a cost-curve rerun, not the parity checks again: --no-parity runs the environment
    row and the cost curves alone (here none)."""
    from click.testing import CliRunner

    from trtspec.gpu_check import main

    result = CliRunner().invoke(main, ["--small", "--no-parity", "--models", "", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert [r["check"] for r in rows] == ["environment"]


def test_read_pins_names_the_line_of_a_malformed_pin(tmp_path):
    """A pin with no name or an empty version is refused with the file's line number (comments and
    blank lines counted); a comment after a pin, even one holding another '#', is dropped."""
    pins = tmp_path / "pins.txt"
    pins.write_text("# header\n\nTorch==2.11.0  # the image's # build\nclick\n")
    assert read_pins(pins) == {"torch": "2.11.0", "click": None}
    for bad in ("==1.0", "torch=="):
        pins.write_text(f"# header\n\n{bad}\n")
        with pytest.raises(ValueError, match=rf"pins.txt:3: expected NAME or NAME==VERSION, got '{bad}'"):
            read_pins(pins)


def test_guard_refuses_distutils_before_setuptools_shim_can_provide_it(tmp_path):
    """Python 3.12 has no distutils: a first-party `import distutils` is refused, even where an earlier
    finder on `sys.meta_path` (setuptools' distutils shim, here) would provide one, so the guard must be
    the first finder asked."""
    _assert_planted_import_refused(tmp_path, "distutils")


def test_check_wheels_refuses_each_wheel_built_for_another_python_or_machine(tmp_path):
    """Only py3 or cp312 wheels for any platform or manylinux x86_64 install on the image: a wheel
    wrong in the interpreter alone, or in the platform alone (aarch64, musl), is named."""
    image, pins, folder = _lists(tmp_path, "")
    fit = ["a-1.0-py3-none-any.whl", "b-1.0-cp312-cp312-manylinux_2_17_x86_64.whl"]
    unfit = ["c-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", "d-1.0-py2-none-any.whl",
             "e-1.0-cp312-cp312-manylinux_2_17_aarch64.whl", "f-1.0-cp312-cp312-musllinux_1_1_x86_64.whl",
             "g-1.0-cp312-cp312-win_amd64.whl"]
    for filename in fit + unfit:
        _wheel(folder, filename, [])
    pins.write_text("".join(f"{f.split('-')[0]}==1.0\n" for f in fit + unfit))
    assert check_wheels(folder, image, pins) == [
        f"{f}: not for CPython 3.12 manylinux x86_64" for f in unfit]


def test_check_wheels_reads_a_requirement_with_a_url_whole(tmp_path):
    """A Requires-Dist line holds colons of its own (a direct URL): the requirement is everything
    after the field's name, not cut at its next colon."""
    image, pins, folder = _lists(tmp_path, "demo==1.0\n")
    _wheel(folder, "demo-1.0-py3-none-any.whl", ["needed @ https://example.org/needed-1.0-py3-none-any.whl"])
    assert check_wheels(folder, image, pins) == [
        "demo-1.0-py3-none-any.whl requires needed @ https://example.org/needed-1.0-py3-none-any.whl, "
        "which is neither carried nor on the image"]


def test_check_wheels_accepts_a_carried_prerelease_a_requirement_admits(tmp_path):
    """pip installs the carried wheel whatever its version: a pinned pre-release that meets a
    requirement's bound (needed 2.0rc1 for needed>=1) is no problem."""
    image, pins, folder = _lists(tmp_path, "demo==1.0\nneeded==2.0rc1\n")
    _wheel(folder, "demo-1.0-py3-none-any.whl", ["needed>=1"])
    _wheel(folder, "needed-2.0rc1-py3-none-any.whl", [])
    assert check_wheels(folder, image, pins) == []
    pins.write_text("demo==1.0\nneeded==0.9rc1\n")
    (folder / "needed-2.0rc1-py3-none-any.whl").unlink()
    _wheel(folder, "needed-0.9rc1-py3-none-any.whl", [])
    assert check_wheels(folder, image, pins) == [
        "demo-1.0-py3-none-any.whl requires needed>=1, but needed 0.9rc1 is what the image would get"]


def test_check_wheels_allows_exactly_the_size_limit_and_names_one_byte_more(tmp_path):
    """The wheels may take MAX_WHEEL_BYTES (48 MiB) of the device tool's 64 MiB, not a byte more."""
    image, pins, folder = _lists(tmp_path, "demo==1.0\n")
    wheel = folder / "demo-1.0-py3-none-any.whl"
    _wheel(folder, wheel.name, [])
    bare, pad_name = wheel.stat().st_size, "demo-1.0.data/data/pad"
    for extra, expected in ((0, []), (1, [f"{folder} holds 48.0 MiB of wheels; keep it under 48 MiB "
                                          "(the device tool carries 64 MiB in all)"])):
        _wheel(folder, wheel.name, [])
        with zipfile.ZipFile(wheel, "a") as z:  # stored: the zip grows by headers + the data exactly
            z.writestr(pad_name, bytes(MAX_WHEEL_BYTES - bare - 76 - 2 * len(pad_name) + extra))
        assert wheel.stat().st_size == MAX_WHEEL_BYTES + extra
        assert check_wheels(folder, image, pins) == expected


def test_check_wheels_command_refuses_bad_arguments_and_names_missing_wheels(tmp_path, capsys):
    """`check-wheels DIR` is the only command: another name, a missing DIR or one too many is usage
    (exit 2), a DIR that is no folder is exit 2 too, and each problem of a folder is one error line
    (exit 1)."""
    usage = "usage: python -m trtspec.gpu.image check-wheels DIR"
    for argv in (["check-wheels"], ["check-wheel", str(tmp_path)], ["check-wheels", str(tmp_path), "x"]):
        assert main(argv) == 2
        assert usage in capsys.readouterr().err
    assert main(["check-wheels", str(tmp_path / "absent")]) == 2
    assert f"error: {tmp_path / 'absent'} is not a folder" in capsys.readouterr().err
    assert main(["check-wheels", str(tmp_path)]) == 1
    errors = capsys.readouterr().err.splitlines()
    pins = read_pins(CARRIED_WHEELS)
    assert len(errors) == len(pins)
    missing = f"error: pydantic=={pins['pydantic']} is listed in wheels.txt but has no wheel in {tmp_path}"
    assert missing in errors


def test_check_wheels_command_reads_its_arguments_and_reports_a_folder_that_installs(tmp_path):
    """`python -m trtspec.gpu.image check-wheels DIR` on wheels of every pinned version, with no
    requirements: exit 0 with their count and size; an empty folder exits 1."""
    pins = read_pins(CARRIED_WHEELS)
    for name, version in pins.items():
        _wheel(tmp_path, f"{name.replace('-', '_')}-{version}-py3-none-any.whl", [])
    with zipfile.ZipFile(next(tmp_path.glob("pydantic-*.whl")), "a") as z:
        z.writestr(f"pydantic-{pins['pydantic']}.data/data/pad", bytes(3 << 19))  # 1.5 MiB stored
    command = [sys.executable, "-m", "trtspec.gpu.image", "check-wheels"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = subprocess.run(command + [str(tmp_path)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == (f"{len(pins)} wheels in {tmp_path} (1.5 MiB): each requirement is carried or on "
                          "the image\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(command + [str(empty)], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "has no wheel in" in run.stderr
