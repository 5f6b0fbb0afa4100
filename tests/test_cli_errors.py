"""Every CLI failure explains itself (issue 21): usage errors exit 2 with usage and name the option;
run-time failures are one `Error:` line, exit 1; `build` owns its output folder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import ASSETS_DIR
from trtspec.output import MARKER
from trtspec.triton.repo import REPO_DIR

from .conftest import REPO, default_ctrl_c

CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"
CHAT_PROMPTS = ASSETS_DIR / "prompts" / "chat.jsonl"


def invoke(*args: str):
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_usage_error(result, *named: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Usage:" in result.output and "Traceback" not in result.output
    for name in named:
        assert name in result.output, (name, result.output)


def assert_run_error(result, *named: str) -> str:
    """Exit 1, no usage, no traceback: one `Error:` line at the end (after any progress bars);
    returns it."""
    out = result.output
    assert result.exit_code == 1, out
    assert "Usage:" not in out and "Traceback" not in out and out.count("Error: ") == 1, out
    start = out.index("Error: ")
    assert start == 0 or out[start - 1] == "\n", out  # on a line of its own
    line = out[start:].rstrip("\n")
    assert "\n" not in line, out
    for name in named:
        assert name in line, (name, line)
    return line


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "trtspec.cli", *map(str, args)], capture_output=True,
                          timeout=600, env=environ, cwd=REPO)


# -- run-time failures vs usage errors --------------------------------------------------------


@pytest.mark.parametrize("scheme", ["grpc", "http"])
def test_unreachable_server_is_a_run_time_failure(scheme, tmp_path):
    url = f"{scheme}://127.0.0.1:{closed_port()}"
    assert_run_error(invoke("generate", "--url", url, "--prompt", "hi"), "cannot reach", url)
    # bench and verify went through the same client (over gRPC they raised tritonclient's
    # "stream is no longer in valid state" traceback)
    assert_run_error(invoke("bench", "--url", url, "--tasks", "math", "--prompts", "1", "--max-tokens", "4",
                            "--out", tmp_path / "b"), "cannot reach")
    assert_run_error(invoke("verify", "--url", url, "--config", CONFIG, "--samples", "0",
                            "--max-tokens", "4"), "cannot reach")


def test_usage_errors_name_the_option(tmp_path):
    assert_usage_error(invoke("generate", "--url", "ftp://x:1", "--prompt", "hi"), "--url", "ftp://x:1")
    assert_usage_error(invoke("bench", "--url", "grpc://x", "--out", tmp_path), "--url")
    assert_usage_error(invoke("bench", CONFIG, "--tasks", "maths", "--out", tmp_path), "--tasks", "maths")
    assert_usage_error(invoke("calibrate", "--drafter", tmp_path / "none", "--target", tmp_path),
                       "--drafter")
    assert_usage_error(invoke("serve", tmp_path, "--http-port", "9000", "--grpc-port", "9000"),
                       "--http-port 9000, --grpc-port 9000")
    assert_usage_error(invoke("serve", tmp_path, "--allowed-origin", "http://localhost:5173/"),
                       "--allowed-origin", "no path", "'http://localhost:5173'")
    assert_usage_error(invoke("serve", tmp_path, "--allowed-origin", "localhost:5173"), "--allowed-origin",
                       "scheme://host[:port]")
    assert_usage_error(invoke("serve", tmp_path, "--allowed-origin", "http://LocalHost:5173"),
                       "--allowed-origin", "browsers send the host in lower case ('http://localhost:5173')")
    assert_usage_error(invoke("serve", tmp_path, "--served-model-name", "a", "--served-model-name", "a"),
                       "--served-model-name", "'a' is given twice")
    misspelt = invoke("train", "dflash", "--target", "builtin:tiny-tagret", "--prompts", CONFIG, "--out",
                      tmp_path / "d")
    assert_usage_error(misspelt, "--target", "'builtin:tiny-tagret' names no shipped model", "tiny-target")
    assert_usage_error(invoke("compare", "--url", "grpc://127.0.0.1:1", "--reference-url", "openai://127.0.0.1:1"),
                       "--url", "expected openai://HOST:PORT, got 'grpc://127.0.0.1:1'")
    assert_usage_error(invoke("compare", "--url", "openai://127.0.0.1:1", "--reference-url", "openai://127.0.0.1:1",
                              "--tie-tolerance", "-1"), "--tie-tolerance")
    missing = invoke("calibrate", "--target", tmp_path / "nowhere")
    assert_usage_error(missing, "--target", "does not exist; or builtin:NAME, a shipped model", "tiny-target")
    # options of a served model, given with a config run here: refused, not silently ignored
    assert_usage_error(invoke("generate", "--config", CONFIG, "--prompt", "hi", "--model", "foo"), "--model",
                       "applies to a served model (--url)")
    assert_usage_error(invoke("bench", CONFIG, "--chat", "--out", tmp_path / "b"), "--chat",
                       "applies to a served model (--url)")
    assert not (tmp_path / "b").exists()
    from trtspec.triton.verify import DEFAULT_SAMPLES, MIN_SAMPLES

    help_text = " ".join(invoke("verify", "--help").output.split())
    assert f"(at least {MIN_SAMPLES};" in help_text and f"[default: {DEFAULT_SAMPLES}]" in help_text
    assert_usage_error(invoke("verify", "--url", "grpc://127.0.0.1:1", "--config", CONFIG, "--samples", "10"),
                       "--samples", f"must be 0 (no sampling test) or at least {MIN_SAMPLES}, got 10")
    assert_usage_error(invoke("train", "dflash", "--target", "builtin:tiny-target", "--prompts",
                              CONFIG, "--out", tmp_path / "d", "--block-size", "1"), "--block-size")
    latin1, number = tmp_path / "latin1.txt", tmp_path / "number.jsonl"
    latin1.write_bytes(b"caf\xe9\n")
    number.write_text('{"prompt": 5}\n')
    for bad, message in ((latin1, "is not UTF-8 text (byte 3)"), (number, ":1: expected a JSON object")):
        result = invoke("verify", "--url", "grpc://127.0.0.1:1", "--config", CONFIG, "--prompts", bad)
        assert_usage_error(result, "--prompts", str(bad), message)
    chat = tmp_path / "chat.jsonl"
    chat.write_text('{"prompt": "hi"}\n{"messages": [{"role": "user"}]}\n')
    result = invoke("train", "dflash", "--target", ASSETS_DIR / "tiny-target", "--prompts", chat, "--out",
                    tmp_path / "d")
    assert_usage_error(result, "--prompts", f"{chat}:2: messages[0] must be an object with 'role' and")
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')  # training only: verify sends text
    result = invoke("verify", "--url", "grpc://127.0.0.1:1", "--config", CONFIG, "--prompts", chat)
    assert_usage_error(result, "--prompts", f"{chat}:1: expected a JSON object with a 'prompt' string")


@pytest.mark.parametrize(
    "args, option",
    [
        (["generate", "--config", CONFIG, "--prompt", "hi", "--seed", str(2**70)], "'--seed'"),
        (["generate", "--url", "http://[::1", "--prompt", "hi"], "--url"),
        (["generate", "--url", "grpc://localhost:99999", "--prompt", "hi"], "--url"),
        (["profile", CONFIG, "--out", "sps.json", "--context", "100000"], "--context"),
        (["bench", CONFIG, CONFIG, "--out", "b"], "repeats the drafter of another config"),
        # nan passed every range check: --wait nan ran as --wait 0, --min-user-tps nan ran the whole
        # bench, --budget-s nan was exit 1 with the first line of a pydantic error
        (["generate", "--url", "grpc://127.0.0.1:1", "--prompt", "hi", "--wait", "nan"],
         "--wait: must be a number, got nan"),
        (["bench", CONFIG, "--concurrency", "1", "--min-user-tps", "nan", "--out", "b"],
         "--min-user-tps: must be a number, got nan"),
        (["profile", "--synthetic", "qwen3-8b", "--out", "s.json", "--budget-s", "nan"],
         "--budget-s: must be > 0, got nan"),
        # found fuzzing the CLI (2026-12-05): each ran on and on, or failed only after hours of work
        (["train", "eagle3", "--target", ASSETS_DIR / "tiny-target", "--prompts", CHAT_PROMPTS, "--out", "e",
          "--ttt-steps", "100000"], "less than or equal to 64"),
        (["train", "dflash", "--target", ASSETS_DIR / "tiny-target", "--prompts", CHAT_PROMPTS, "--out", "d",
          "--epochs", "1e300"], "less than or equal to 1000"),
        (["calibrate", "--drafter", ASSETS_DIR / "tiny-dspark-b15", "--target", ASSETS_DIR / "tiny-target",
          "--bins", "100000000"], "--bins: must be in [2, 1000]"),
        (["train", "target", "--out", "afile/sub", "--steps", "1"],
         "afile is a file, so afile/sub cannot be made"),
        (["train", "dspark", "--target", ASSETS_DIR / "tiny-target", "--prompts", CHAT_PROMPTS, "--out", "s",
          "--markov-rank", str(2**63)], "less than or equal to 8192"),  # a C++ TypeError's traceback
        (["train", "dflash", "--target", ASSETS_DIR / "tiny-target", "--prompts", CHAT_PROMPTS, "--out", "d",
          "--block-size", "100000"], "less than or equal to 256"),  # refused only after regenerating
        (["verify", "--url", "grpc://127.0.0.1:1", "--config", CONFIG, "--api-key", "x"],
         "--api-key: applies to an OpenAI-compatible server"),  # silently ignored
        (["profile", CONFIG, "--out", "p.json", "--batches", "100000"], "--batches: 256 cached tokens plus"),
        (["profile", CONFIG, "--out", "p.json", "--requests", "100000000"],
         "--requests: must be in [1, 256]"),  # an allocation of 563 GB
        # each measured or ran the same thing twice, silently
        (["bench", CONFIG, "--concurrency", "1,4,1", "--out", "b"],
         "--concurrency: 1 given twice in '1,4,1'"),
        (["bench", CONFIG, "--tasks", "chat,math,chat", "--out", "b"], "--tasks: chat given twice"),
        (["calibrate", "--drafter", ASSETS_DIR / "tiny-dspark-b15", "--target", ASSETS_DIR / "tiny-target",
          "--tasks", "chat,chat"], "--tasks: chat given twice"),
        (["profile", CONFIG, "--out", "p.json", "--batches", "8,8"], "--batches: 8 given twice"),
        # "File name too long" named neither the option nor the limit
        (["build", CONFIG, "--out", "b" * 256 + "/x"],
         "'--out': the path holds a name of 256 bytes, over the 255"),
        (["serve", "/" + "d/" * 2100], "'DIR': the path is 4,201 bytes long, over the 4,095"),
        # exit 1 with "--out afile/x: cannot create afile: File exists" (after loading the models, torch)
        (["build", CONFIG, "--out", "afile/x"], "--out: afile is a file, so afile/x cannot be made"),
        (["build", CONFIG, "--flavour", "engine", "--out", "afile/x"], "afile is a file, so afile/x"),
    ],
    ids=["seed-over-uint64", "ipv6-url", "port-out-of-range", "context-past-positions", "same-config-twice",
         "wait-nan", "min-user-tps-nan", "budget-nan", "ttt-steps-huge", "epochs-huge", "bins-huge",
         "train-out-under-a-file", "markov-rank-huge", "block-size-huge", "verify-key-for-triton",
         "profile-batch-past-positions", "profile-requests-huge", "concurrency-twice", "bench-task-twice",
         "calibrate-task-twice", "batches-twice", "out-name-too-long", "dir-path-too-long",
         "build-out-under-a-file", "engine-build-out-under-a-file"],
)
def test_values_that_used_to_crash_are_usage_errors(tmp_path, monkeypatch, args, option):
    """Found looking for the issue's class of defect: each was a traceback, a one-line message that
    did not name the option, or (profile) an attempt to allocate 640 GB."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert_usage_error(result, option)


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "dflash", "--target-layer-ids", "1,99"], "--target-layer-ids: must be layers in [0, 6)"),
        (["train", "dspark", "--target-layer-ids", "1,99"], "--target-layer-ids: must be layers in [0, 6)"),
        (["train", "eagle3", "--draft-vocab-size", "100000"],
         "--draft-vocab-size: 100000 exceeds the target's vocabulary of 264"),
        (["train", "dflash", "--mask-token-id", "9999"],
         "--mask-token-id: 9999 is not in the target's vocabulary"),
        (["train", "dflash", "--target-layer-ids", "2,2"], "--target-layer-ids: 2 given twice in '2,2'"),
        (["train", "dspark", "--target-layer-ids", "4,1"],
         "--target-layer-ids: must name each layer once, in ascending order"),
        (["train", "eagle3", "--aux-layer-ids", "3,2,1"], "--aux-layer-ids: must name each layer once"),
        (["train", "eagle3", "--aux-layer-ids", "1,2"], "--aux-layer-ids: must be 3 layers in [0, 6)"),
    ],
    ids=["dflash-taps", "dspark-taps", "eagle3-vocab", "mask-id", "dflash-twice", "dspark-descending",
         "eagle3-descending", "eagle3-two"],
)
def test_training_options_the_target_cannot_take(tmp_path, args, message):
    """Checked against the loaded target before its responses are regenerated (they were an
    IndexError traceback after it), and refused as what they are: a usage error naming the option
    (they were exit 1, a run-time failure)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("import os\n")
    result = invoke(*args, "--target", ASSETS_DIR / "tiny-target", "--prompts", prompts,
                    "--out", tmp_path / "o")
    assert_usage_error(result, f"Invalid value for {message}")
    assert not (tmp_path / "o" / "checkpoint" / "data.pt").exists()


def test_serve_on_a_host_that_does_not_resolve(tmp_path):
    proc = run("serve", tmp_path, "--host", "nohost.invalid")
    assert proc.returncode == 1
    assert proc.stderr.decode().strip().splitlines() == [
        "Error: cannot bind to host 'nohost.invalid': Name or service not known (--host)"]


def test_prompt_that_is_not_utf8_names_prompt():
    """Bytes that are not UTF-8 reach Python as lone surrogates (argv is decoded with surrogateescape)."""
    proc = subprocess.run([sys.executable, "-m", "trtspec.cli", "generate", "--config", str(CONFIG),
                           "--prompt", b"\xff\xfeab"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Invalid value for --prompt: is not valid UTF-8 text (byte 0)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_verify_help_shows_dir_as_optional():
    result = invoke("verify", "--help")
    assert result.exit_code == 0
    assert "Usage: main verify [OPTIONS] [DIR]" in result.output


def test_yaml_with_several_mistakes_lists_them_all(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("target: {path: builtin:tiny-target}\nflavour: gpu\nlimits: {max_tokens: 0}\n"
                    "drafter: {method: dflash, path: x, num_draft_tokens: 99}\n")
    result = invoke("generate", "--config", path, "--prompt", "hi")
    assert_usage_error(result, f"{path}: 3 mistakes:")
    assert "field `flavour`: Input should be 'torch', 'engine' or 'trtllm', got 'gpu'" in result.output
    assert "field `limits.max_tokens`: Input should be greater than or equal to 1, got 0" in result.output
    assert ("field `drafter.num_draft_tokens`: Input should be less than or equal to 64, got 99"
            in result.output)
    assert "more)" not in result.output


# -- train and calibrate ----------------------------------------------------------------------


def test_train_target_needs_an_out_folder():
    """Its old default was trtspec/assets, where it overwrote the shipped models."""
    result = invoke("train", "target", "--steps", "1")
    assert_usage_error(result, "Missing option '--out'")
    assert "default: trtspec/assets" not in invoke("train", "target", "--help").output


@pytest.mark.parametrize("method", ["dflash", "dspark", "eagle3"])
def test_train_max_steps(tmp_path, method):
    """Each drafter trains for --max-steps and writes a checkpoint its loader takes."""
    from transformers import AutoConfig

    from trtspec.models.dflash import load_dflash
    from trtspec.models.dspark import load_dspark
    from trtspec.models.eagle3 import load_eagle3

    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nimport os\nQ: 2 + 3\n")
    out = tmp_path / method
    shape = ["--block-size", "4", "--layers", "1"] if method != "eagle3" else []
    proc = run("train", method, "--target", ASSETS_DIR / "tiny-target", "--prompts", prompts, "--out", out,
               *shape, "--response-tokens", "16", "--max-steps", "2")
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    report = json.loads((out / "training.json").read_text())
    # 3 prompts: DSpark's and EAGLE-3's default epochs and batch run out of data after 1 step
    assert report["recipe"]["max_steps"] == 2
    assert report["history"][-1]["step"] == (2 if method == "dflash" else 1)
    assert b"attention mask" not in proc.stderr  # transformers' warning about pad == eos
    load = {"dflash": load_dflash, "dspark": load_dspark, "eagle3": load_eagle3}[method]
    assert load(out, AutoConfig.from_pretrained(ASSETS_DIR / "tiny-target")) is not None


def test_train_into_an_earlier_run_refuses_what_it_cannot_resume(tmp_path):
    """A finished run rerun, another method's checkpoint, or cached continuations of other options
    are one line each (they were an IndexError, a state_dict traceback, and a run that silently
    trained on the old prompts' continuations)."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("def add(a, b):\nimport os\nQ: 2 + 3\n")
    out = tmp_path / "o"
    common = ["--target", ASSETS_DIR / "tiny-target", "--prompts", prompts, "--out", out, "--block-size", "4",
              "--layers", "1", "--max-steps", "1"]
    first = invoke("train", "dspark", *common, "--response-tokens", "16")
    assert first.exit_code == 0, first.output
    history = json.loads((out / "training.json").read_text())["history"]
    again = invoke("train", "dspark", *common, "--response-tokens", "16")
    assert_run_error(again, "state.pt", "nothing to train")
    assert json.loads((out / "training.json").read_text())["history"] == history  # not rewritten empty
    other_method = invoke("train", "dflash", *common, "--response-tokens", "16")
    assert_run_error(other_method, "state.pt", "not a checkpoint of this DFlash recipe")
    # --max-steps 2 resumes the run, but not with another block size (the weights' shapes are the same)
    other_block = invoke("train", "dspark", *common[:6], "--block-size", "5", "--layers", "1",
                         "--max-steps", "2", "--response-tokens", "16")
    assert_run_error(other_block, "state.pt", "another DSpark recipe (block_size was 4, this run 5)")
    # the same recipe, longer (--epochs and --max-steps may change on a resume)
    resumed = invoke("train", "dspark", *common[:-1], "2", "--epochs", "20", "--response-tokens", "16")
    assert resumed.exit_code == 0, resumed.output
    kept = json.loads((out / "training.json").read_text())["history"]
    assert kept[:1] == history and [h["step"] for h in kept] == [1, 2]  # the first run's step kept
    other_length = invoke("train", "dspark", *common, "--response-tokens", "24")
    assert_run_error(other_length, "data.pt", "--response-tokens was 16")
    prompts.write_text("x = 1\n")
    assert_run_error(invoke("train", "dspark", *common, "--response-tokens", "16"), "data.pt", "--prompts")
    # a file cut short (a run killed while writing it) was a PytorchStreamReader traceback
    prompts.write_text("def add(a, b):\nimport os\nQ: 2 + 3\n")
    remedies = {"state.pt": "delete it to train from step 0", "data.pt": "delete it to regenerate"}
    for name, remedy in remedies.items():
        torn = out / "checkpoint" / name
        torn.write_bytes(torn.read_bytes()[:1000])
        line = assert_run_error(invoke("train", "dspark", *common[:-1], "3", "--epochs", "20",
                                       "--response-tokens", "16"), str(torn), "cannot be read", remedy)
        assert "PytorchStreamReader" in line
        torn.unlink()


def test_train_writes_only_into_its_own_folder(tmp_path):
    """`--out` that is the target, or a folder of other files, was trained into: config.json and
    model.safetensors overwritten (a copy of tiny-target given as both ran and replaced the target
    by a drafter). Refused before anything loads."""
    target = tmp_path / "target"
    shutil.copytree(ASSETS_DIR / "tiny-target", target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    prompts = tmp_path / "p.txt"
    prompts.write_text("import os\n")
    for method in ("dflash", "dspark", "eagle3"):
        result = invoke("train", method, "--target", target, "--prompts", prompts, "--out", target)
        assert_usage_error(result, "--out", "is the --target folder")
        # another checkpoint (tiny-target has a training.json too: from `train target`)
        result = invoke("train", method, "--target", ASSETS_DIR / "tiny-target", "--prompts", prompts,
                        "--out", target)
        assert_usage_error(result, "--out", "holds files but no earlier training run (no checkpoint/")
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    # --epochs inf was an OverflowError traceback
    assert_usage_error(invoke("train", "dflash", "--target", target, "--prompts", prompts, "--out",
                              tmp_path / "o", "--epochs", "inf"), "--epochs", "finite")


def test_an_exceptions_one_line_drops_nested_prefixes_and_is_cut_at_its_limit():
    """one_line: the message on one line without the "SomeError: " prefixes a library nests, the
    exception's type where it has no message, and a message longer than the limit cut to exactly the
    limit, its last character an ellipsis (one exactly as long as the limit is kept whole)."""
    from trtspec.models.checkpoint import one_line

    assert one_line(RuntimeError("OSError: ValueError: bad\n  header")) == "bad header"
    assert one_line(KeyError()) == "KeyError"
    assert one_line(ValueError("x" * 40), limit=40) == "x" * 40
    assert one_line(ValueError("x" * 39 + "yz"), limit=40) == "x" * 39 + "…"


def test_a_config_size_past_what_torch_allocates_is_named_without_torchs_stack_frames(tmp_path):
    """intermediate_size 2**70 (and a DSpark markov_rank of it) failed torch.empty with its C++ stack
    frames in the message ("Exception raised from THPUtils_unpackLong at /__w/pytorch/…: frame #0
    …"), which the one `Error:` line quoted; it ends where torch's own message does now."""
    target = tmp_path / "target"
    shutil.copytree(REPO / "trtspec" / "assets" / "tiny-target", target)
    raw = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**raw, "intermediate_size": 2**70}))
    config = tmp_path / "c.yaml"
    config.write_text(f"target: {{path: {target}}}\n")
    line = assert_run_error(invoke("generate", "--config", config, "--prompt", "x", "--max-tokens", 2,
                                   "--drafter", "none"),
                            f"{target}/config.json", "the target does not build from it")
    assert line.endswith('with error "Overflow when unpacking long long"'), line
    assert "frame #" not in line and "Exception raised from" not in line


def test_an_int_field_is_the_configs_integer_its_default_only_when_absent(tmp_path):
    """int_field: a given value wins over the default (a drafter's num_anchors, block_size), the
    default stands in only for an absent field, and a value that is no integer (a bool, a string, a
    float) is refused naming the field."""
    from trtspec.errors import CheckpointError
    from trtspec.models.checkpoint import int_field

    where = tmp_path / "config.json"
    assert int_field({"num_anchors": 64}, "num_anchors", str(where), "DSpark", default=512) == 64
    assert int_field({}, "num_anchors", str(where), "DSpark", default=512) == 512
    with pytest.raises(CheckpointError, match="missing DSpark field 'num_anchors'"):
        int_field({}, "num_anchors", str(where), "DSpark")
    for bad in (True, "64", 64.0, None):
        with pytest.raises(CheckpointError, match=r"dflash_config\.block_size must be an integer"):
            int_field({"block_size": bad}, "block_size", str(where), "DFlash", "dflash_config.")


def test_a_checkpoint_is_written_into_folders_it_makes_or_over_one_there(tmp_path):
    """write_checkpoint makes the folders its path names and writes again where a checkpoint is."""
    import torch
    from safetensors.torch import load_file

    from trtspec.models.checkpoint import write_checkpoint

    model, out = torch.nn.Linear(3, 2), tmp_path / "run" / "final"
    for step in (1, 2):
        write_checkpoint(model, {"step": step}, out)
    assert json.loads((out / "config.json").read_text()) == {"step": 2}
    assert torch.equal(load_file(out / "model.safetensors")["weight"], model.weight.detach())


def test_a_checkpoint_interrupted_while_written_keeps_the_last_one(tmp_path, monkeypatch):
    """Ctrl-C while `state.pt` or the weights were written left them cut short, and the next run
    a traceback (above); now each is written beside and renamed over the last one when complete."""
    import torch
    from safetensors.torch import load_file

    from trtspec.models.checkpoint import write_checkpoint
    from trtspec.train import dflash
    from trtspec.train.dflash import DFlashTrainConfig, save_state

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    gen = torch.Generator().manual_seed(0)
    state_file, cfg = tmp_path / "checkpoint" / "state.pt", DFlashTrainConfig()
    save_state(state_file, model, opt, gen, 1, cfg)
    write_checkpoint(model, {"step": 1}, tmp_path)
    weights = load_file(tmp_path / "model.safetensors")

    def interrupted(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    def interrupted_weights(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\x10\x00\x00")
        raise KeyboardInterrupt

    monkeypatch.setattr(dflash.torch, "save", interrupted)
    monkeypatch.setattr("trtspec.models.checkpoint.save_file", interrupted_weights)
    with torch.no_grad():
        model.weight.add_(1)
    with pytest.raises(KeyboardInterrupt):
        save_state(state_file, model, opt, gen, 2, cfg)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(model, {"step": 2}, tmp_path)
    monkeypatch.undo()
    assert torch.load(state_file)["step"] == 1
    assert torch.equal(load_file(tmp_path / "model.safetensors")["weight"], weights["weight"])
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["checkpoint", "config.json", "model.safetensors",
                                                          "state.pt"]


@pytest.mark.parametrize("args, option", [
    (["profile", CONFIG, "--out", "s.json", "--device", "cpu"], "--device"),
    (["profile", CONFIG, "--out", "s.json", "--batch-sizes", "1,2"], "--batch-sizes"),
    (["profile", CONFIG, "--out", "s.json", "--budget-s", "5"], "--budget-s"),
    (["profile", "--synthetic", "qwen3-8b", "--out", "s.json", "--context", "64"], "--context"),
    (["profile", "--synthetic", "qwen3-8b", "--out", "s.json", "--batches", "1,2"], "--batches"),
    (["bench", CONFIG, "--sps", CONFIG], "--sps"),
    (["bench", CONFIG, "--max-users", "4"], "--max-users"),
    (["bench", CONFIG, "--min-user-tps", "10"], "--min-user-tps"),
    (["bench", "--url", "grpc://127.0.0.1:1", "--tree", "auto"], "--tree"),
    (["bench", "--url", "grpc://127.0.0.1:1", "--repeats", "3"], "--repeats"),
    (["bench", "--url", "grpc://127.0.0.1:1", "--doc", "r.md"], "--doc"),
])
def test_options_that_would_be_ignored_are_refused(args, option):
    """Each of these used to run (the profile on the CPU whatever --device said) and drop the option."""
    assert_usage_error(invoke(*args), option)


def test_output_paths_of_the_wrong_kind_are_refused_before_the_run(tmp_path):
    """They used to fail after the whole measurement (`Error: afile: File exists`)."""
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    assert_usage_error(invoke("bench", CONFIG, "--out", a_file), "--out", "is a file")
    assert_usage_error(invoke("bench", CONFIG, "--doc", tmp_path), "--doc", "is a folder")
    assert_usage_error(invoke("profile", CONFIG, "--out", tmp_path), "--out", "is a folder")
    # a path under a file failed after the whole run ("Error: afile/x: Not a directory", "File exists")
    for args, option in ((["bench", CONFIG, "--out", a_file / "x"], "--out"),
                         (["bench", CONFIG, "--out", tmp_path / "b", "--doc", a_file / "r.md"], "--doc"),
                         (["profile", CONFIG, "--out", a_file / "sps.json"], "--out")):
        assert_usage_error(invoke(*args), option, f"{a_file} is a file, so", "cannot be made")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_a_config_that_is_a_folder_or_not_utf8_is_named(tmp_path):
    assert_usage_error(invoke("build", tmp_path, "--out", tmp_path / "o"), "CONFIG", "is a folder")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfename: x\n")
    assert_usage_error(invoke("build", binary, "--out", tmp_path / "o"), "CONFIG", "bin.yaml: not UTF-8")
    # it said /dev/null "does not exist" (found fuzzing the CLI)
    assert_usage_error(invoke("inspect", "/dev/null"), "CONFIG", "/dev/null is not a regular file")


def test_calibrate_takes_any_response_length(tmp_path):
    drafter = shutil.copytree(ASSETS_DIR / "tiny-dspark-b15", tmp_path / "dspark")
    (drafter / "sts.json").unlink()
    ok = run("calibrate", "--drafter", drafter, "--target", ASSETS_DIR / "tiny-target", "--tasks", "math",
             "--response-tokens", "16")
    assert ok.returncode == 0, ok.stderr.decode()[-2000:]
    assert len(json.loads((drafter / "sts.json").read_text())["temperatures"]) == 15
    assert b"attention mask" not in ok.stderr
    # too short for one block of 15 drafts: refused in one line, not a torch traceback
    short = invoke("calibrate", "--drafter", drafter, "--target", ASSETS_DIR / "tiny-target", "--tasks",
                   "math", "--response-tokens", "2")
    assert_run_error(short, "raise --response-tokens")


def test_calibrate_refuses_an_sts_json_folder_before_it_runs(tmp_path):
    """It failed once the temperatures were fitted, naming the temporary file beside it
    ("/…/.sts.json.l4a3dflj.tmp: Is a directory")."""
    drafter = shutil.copytree(ASSETS_DIR / "tiny-dspark-b15", tmp_path / "dspark")
    (drafter / "sts.json").unlink()
    (drafter / "sts.json").mkdir()
    result = invoke("calibrate", "--drafter", drafter, "--target", ASSETS_DIR / "tiny-target",
                    "--tasks", "math", "--response-tokens", "16")
    assert_usage_error(result, "--drafter", f"{drafter / 'sts.json'} is a folder")
    assert "regenerate" not in result.output


def test_regenerated_rows_follow_the_prompts():
    """Prompts are batched by length; row r must still continue prompt r (anchors and loss masks
    are placed with prompt r's length)."""
    from trtspec.models.target import load_causal_lm
    from trtspec.train.prompts import regenerate

    target = load_causal_lm(ASSETS_DIR / "tiny-target")
    prompts = [list(b"def f(x):\n"), list(b"Q: 1 + 2\nA:"), list(b"import os\n"), list(b"Q: 10 + 20\nA:")]
    seqs, lens = regenerate(target, prompts, 4, (target.config.eos_token_id,))
    assert [seqs[r, : len(p)].tolist() for r, p in enumerate(prompts)] == prompts
    assert all(len(p) < n <= len(p) + 4 for p, n in zip(prompts, lens.tolist(), strict=True))


# -- bench, inspect ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, option, message",
    [
        (["--coupling", "gumbel"], "--coupling", "give --temperature > 0 too"),
        (["--temperature", "-1"], "--temperature", "greater than or equal to 0"),
        (["--temperature", "inf"], "--temperature", "a finite number, got inf"),
        (["--temperature", "1", "--top-p", "0"], "--top-p", "greater than 0"),
        (["--temperature", "1", "--write-acceptance"], "--write-acceptance", "measure it at --temperature 0"),
        (["--url", "grpc://127.0.0.1:1", "--temperature", "1", "--coupling", "gumbel"], "--coupling",
         "a server verifies by its build config's sampling.coupling"),
    ],
    ids=["coupling-greedy", "negative-temperature", "infinite-temperature", "top-p-0", "sampled-acceptance",
         "coupling-of-a-server"],
)
def test_bench_sampling_options_name_the_option(tmp_path, args, option, message):
    """Refused before any model loads or request goes out."""
    configs = [] if "--url" in args else [CONFIG]
    result = invoke("bench", *configs, *args, "--out", tmp_path / "b")
    assert_usage_error(result, option, message)
    assert not (tmp_path / "b").exists()


def test_inspect_says_what_each_number_is():
    result = invoke("inspect", REPO / "build_configs" / "gpt-oss-120b-dflash-b300-tp8.yaml")
    assert result.exit_code == 0, result.output
    assert "128 requests x 327,517 tokens" not in result.output
    assert ("max_batch_size 128 requests of max_seq_len 32,768 tokens: fit (KV room for 327,517 each)"
            in result.output)
    assert "KV room for 1,275 requests of max_seq_len 32,768 tokens" in result.output
    deepseek = invoke("inspect", REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml").output
    assert ("max_batch_size 64 requests of max_seq_len 65,536 tokens: fit (KV room for 492,120 each)"
            in deepseek)


# -- build ------------------------------------------------------------------------------------


def _config(tmp_path: Path, name: str, **drafter) -> Path:
    raw = yaml.safe_load(CONFIG.read_text())
    raw["name"] = name
    raw["drafter"].update(drafter)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_build_owns_its_output(tmp_path):
    out = tmp_path / "out"
    assert invoke("build", _config(tmp_path, "alpha"), "--out", out).exit_code == 0
    assert (out / MARKER).is_file() and (out / REPO_DIR / "alpha").is_dir()
    # a rebuild replaces the whole folder: no stale model left for tritonserver to load
    result = invoke("build", _config(tmp_path, "beta"), "--out", out)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (out / REPO_DIR).iterdir()) == ["beta"]
    # another flavour's build replaces it too
    engine = invoke("build", _config(tmp_path, "gamma"), "--out", out, "--flavour", "engine")
    assert engine.exit_code == 0, engine.output
    assert sorted(p.name for p in (out / REPO_DIR).iterdir()) == ["gamma"]
    assert (out / "manifest.json").is_file()
    # a folder it did not write is refused and left as it was
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert_usage_error(invoke("build", CONFIG, "--out", foreign), f"--out: {foreign} is not empty",
                       "was not written by `trtspec build`")
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no staging left


def test_build_into_a_mounted_volume_replaces_its_contents(tmp_path):
    """A mount point (a container volume) cannot be renamed: the build replaces what is inside."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "trtspec-test", str(volume)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        assert invoke("build", _config(tmp_path, "alpha"), "--out", volume).exit_code == 0
        result = invoke("build", _config(tmp_path, "beta"), "--out", volume)
        assert result.exit_code == 0, result.output
        assert sorted(p.name for p in (volume / REPO_DIR).iterdir()) == ["beta"]
        assert (volume / MARKER).is_file()
    finally:
        subprocess.run(["umount", str(volume)], check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alpha.yaml", "beta.yaml", "volume"]


def test_build_runs_the_drafter_fit_checks_of_generate(tmp_path):
    bad = _config(tmp_path, "bad", method="eagle3")  # an EAGLE-3 config pointing at a DFlash checkpoint
    message = "num_hidden_layers is 2; an EAGLE-3 drafter has one midlayer"
    assert message in invoke("generate", "--config", bad, "--prompt", "hi").output
    assert_run_error(invoke("build", bad, "--out", tmp_path / "out"), message)
    assert not (tmp_path / "out").exists()


def test_kv_slots_larger_than_the_machine_are_refused_before_allocating(tmp_path):
    """A target whose positions (max_position_embeddings, unbounded by limits.max_input_tokens)
    times limits.max_concurrency need more K/V than the machine has free: `build` and `generate`
    say so in one line naming the limits, instead of an out-of-memory crash; bounded, it builds."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from .conftest import _small_kwargs

    long_context = {**_small_kwargs(3), "max_position_embeddings": 1 << 30}  # 768 GiB a slot
    Qwen3ForCausalLM(Qwen3Config(**long_context)).save_pretrained(tmp_path / "long")
    config = {"name": "long", "flavour": "torch", "target": {"path": str(tmp_path / "long")},
              "limits": {"max_tokens": 64}}
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(config))
    line = assert_run_error(invoke("build", tmp_path / "long.yaml", "--out", tmp_path / "out"),
                            "8 requests (limits.max_concurrency) of 1,073,741,824 positions", "6144.0 GiB",
                            "set limits.max_input_tokens", "or lower limits.max_concurrency")
    assert not (tmp_path / "out").exists(), line
    generate = invoke("generate", "--config", tmp_path / "long.yaml", "--prompt", "hi", "--max-tokens", 8)
    line = assert_run_error(generate, "1 request of 1,073,741,824 positions", "set limits.max_input_tokens")
    assert "max_concurrency" not in line
    config["limits"]["max_input_tokens"] = 1000
    (tmp_path / "long.yaml").write_text(yaml.safe_dump(config))
    assert invoke("build", tmp_path / "long.yaml", "--out", tmp_path / "out").exit_code == 0


@pytest.mark.parametrize("args", [["build", CONFIG, "--flavour", "engine"],
                                  ["build", CONFIG, "--flavour", "torch"],
                                  ["bench", CONFIG, "--prompts", 1, "--max-tokens", 4]])
def test_an_output_in_a_read_only_place_is_refused_before_the_run(tmp_path, args):
    """Root writes through permission bits, so the up-front check passed /sys and /proc, and the
    run failed only when it wrote (bench: once everything was measured); a folder is tried for real
    now, and the user's folder is named (not a staging folder)."""
    if os.geteuid() == 0:  # sysfs refuses everyone
        parent = Path("/sys/fs")
    else:
        parent = tmp_path / "ro"
        parent.mkdir(mode=0o555)
    out = parent / "trtspec-out"
    result = invoke(*args, "--out", out)
    assert_usage_error(result, "--out", f"cannot write in {parent}")
    assert f"{parent}/." not in result.output


def test_trtllm_build_without_drafter_weights_says_what_to_do(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(REPO / "build_configs/llama3.1-8b-dflash.yaml"),
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    note = result.stderr.strip()
    assert note.startswith("note: drafter weights ")
    assert "LLaMA3.1-8B-Instruct-DFlash-UltraChat are not here" in note
    assert "trtllm-serve.yaml has no mask_token_id / target_layer_ids" in note
    assert f"converts the drafter into {out / 'drafter'}" in note
    assert "/models/LLaMA3.1-8B-Instruct-DFlash-UltraChat on the nodes" in note


def test_prompt_beyond_the_context_is_refused_with_the_numbers(tmp_path):
    """A 20,000-byte prompt to a model with 4,096 positions, and a prompt beyond
    limits.max_input_tokens: refused before anything is decoded, naming the numbers."""
    result = invoke("generate", "--config", CONFIG, "--prompt", "x" * 20_000, "--max-tokens", "16")
    assert_usage_error(result, "--prompt / --max-tokens",
                       "prompt of 20000 tokens + max_tokens 16 = 20016 tokens exceeds this deployment's "
                       "context of 4096")
    limited = tmp_path / "limited.yaml"
    text = CONFIG.read_text().replace("max_tokens: 2048", "max_tokens: 2048\n  max_input_tokens: 64")
    limited.write_text(text)
    result = invoke("generate", "--config", limited, "--prompt", "y" * 65, "--max-tokens", "4")
    assert_usage_error(result, "prompt of 65 tokens exceeds limits.max_input_tokens 64")
    ok = invoke("generate", "--config", limited, "--prompt", "y" * 64, "--max-tokens", "4", "--json")
    assert ok.exit_code == 0, ok.output


def test_chat_with_a_target_that_has_no_chat_template_is_one_line(random_qwen3_dir, tmp_path):
    config = tmp_path / "plain.yaml"
    config.write_text(yaml.safe_dump({"name": "plain", "target": {"path": str(random_qwen3_dir)}}))
    result = invoke("generate", "--config", config, "--chat", "--prompt", "hi", "--max-tokens", 4)
    assert_run_error(result, str(random_qwen3_dir), "has no chat template")


@pytest.mark.parametrize("drafter", ["tiny-dflash-b16", "tiny-dspark-b15", "tiny-eagle3"])
def test_a_drafter_checkpoint_given_as_the_target_is_named(tmp_path, drafter):
    """transformers loaded it as a causal LM with a random lm_head (a MISSING-weights report), and
    the error that followed spoke of a tokenizer or a mask token."""
    config = tmp_path / "c.yaml"
    config.write_text(f"target: {{path: builtin:{drafter}}}\n")
    line = assert_run_error(invoke("generate", "--config", config, "--prompt", "x", "--max-tokens", "2"),
                            f"{drafter}/config.json", "is a drafter checkpoint")
    assert "MISSING" not in line
    prompts = tmp_path / "p.txt"
    prompts.write_text("x\n")
    assert_run_error(invoke("train", "dflash", "--target", ASSETS_DIR / drafter, "--prompts", prompts,
                            "--out", tmp_path / "o"), "is a drafter checkpoint")


def test_trtllm_needs_say_what_they_need(tmp_path):
    """A config without `deployment:` names what plans from it; a trtllm config run here names
    where it runs and the override; train's --out must be a folder, said before anything loads."""
    for args in (("inspect", CONFIG), ("build", CONFIG, "--flavour", "trtllm", "--out", tmp_path / "o")):
        assert_run_error(invoke(*args), "no `deployment:` section, which the trtllm flavour and `inspect`")
    assert not (tmp_path / "o").exists()
    trtllm = tmp_path / "trtllm.yaml"
    trtllm.write_text(CONFIG.read_text().replace("flavour: torch", "flavour: trtllm"))
    assert "flavour: trtllm" in trtllm.read_text()
    assert_run_error(invoke("generate", "--config", trtllm, "--prompt", "hi"),
                     "flavour 'trtllm' runs under TensorRT-LLM", "generate: --flavour torch")
    a_file = tmp_path / "afile"
    a_file.write_text("")
    for method in ("dflash", "dspark", "eagle3"):
        assert_usage_error(invoke("train", method, "--out", a_file), "--out", "is a file")


def test_flavour_override_is_held_to_the_configs_checks(tmp_path):
    """`build --flavour trtllm` of a gumbel-coupled engine config wrote TensorRT-LLM artifacts (exit 0)
    that sample with rejection instead, and a name its Kubernetes Service cannot take: a plain copy of
    the config skipped the checks its YAML would get."""
    raw = yaml.safe_load((REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml").read_text())
    raw["sampling"] = {"coupling": "gumbel"}
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(raw))
    result = invoke("build", config, "--flavour", "trtllm", "--out", tmp_path / "o")
    assert_usage_error(result, "--flavour", "trtllm: sampling.coupling gumbel needs flavour torch or engine")
    raw["sampling"], raw["name"] = {"coupling": "rejection"}, "Qwen3_8B"
    config.write_text(yaml.safe_dump(raw))
    result = invoke("build", config, "--flavour", "trtllm", "--out", tmp_path / "o")
    assert_usage_error(result, "--flavour", "names its Kubernetes Service after it")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("part", ["target", "drafter"])
def test_weights_cut_short_are_named(tmp_path, part):
    """A model.safetensors cut short (a copy interrupted) was a SafetensorError traceback."""
    shipped = {"target": "tiny-target", "drafter": "tiny-dflash-b16"}[part]
    folder = tmp_path / shipped
    shutil.copytree(ASSETS_DIR / shipped, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100_000])
    paths = {"target": "builtin:tiny-target", "drafter": "builtin:tiny-dflash-b16", part: str(folder)}
    config = tmp_path / "c.yaml"
    config.write_text(f"target: {{path: {paths['target']}}}\n"
                      f"drafter: {{method: dflash, path: {paths['drafter']}}}\n")
    line = assert_run_error(invoke("generate", "--config", config, "--prompt", "x", "--max-tokens", "2"),
                            "a weight file cannot be read", "copy the checkpoint's weight files again")
    assert str(weights if part == "drafter" else folder) in line


@pytest.mark.parametrize("edit, message", [
    (lambda raw: [1, 2], "config.json is not a JSON object of config fields"),  # AttributeError
    (lambda raw: {**raw, "vocab_size": "many"},  # huggingface_hub's StrictDataclassFieldValidationError
     "config.json: transformers cannot read it: Validation error for field 'vocab_size'"),
], ids=["a-list", "vocab-size-text"])
def test_a_target_config_json_transformers_cannot_read_is_named(tmp_path, edit, message):
    """Both were tracebacks."""
    folder = tmp_path / "t"
    shutil.copytree(ASSETS_DIR / "tiny-target", folder)
    config_json = folder / "config.json"
    config_json.write_text(json.dumps(edit(json.loads(config_json.read_text()))))
    config = tmp_path / "c.yaml"
    config.write_text(f"target: {{path: {folder}}}\n")
    assert_run_error(invoke("generate", "--config", config, "--prompt", "x", "--max-tokens", "2"),
                     str(folder), message)


@pytest.mark.parametrize("shipped, edit, message", [
    # transformers started the missing layers at random and only logged it: a model not the user's;
    # checked on the meta device before anything is allocated
    ("tiny-target", {"num_hidden_layers": 8, "layer_types": ["full_attention"] * 8},
     "config.json describes a model of 5,645,568 parameters but the weights hold 4,268,032"),
    # was an allocation of 86 GB: the fuzz's machine out of memory
    ("tiny-target", {"intermediate_size": 640_000}, "the weights do not match config.json: "
     "model.layers.0.mlp.down_proj.weight is [256, 640] in the weights, [256, 640000] by config.json"),
    ("tiny-target", {"intermediate_size": 300}, "the weights do not match config.json: "
     "model.layers.0.mlp.down_proj.weight is [256, 640] in the weights, [256, 300] by config.json"),
    ("tiny-draft", {"intermediate_size": 300}, "the weights do not match config.json"),
    # each a traceback, found by tests/config_fuzz.py
    ("tiny-target", {"trtspec_chat_stop": 5}, "trtspec_chat_stop must be a list of texts"),
    ("tiny-target", {"trtspec_special_tokens": {"eos": "x"}},
     "config.json: the target does not build from it: trtspec_special_tokens must map"),
    ("tiny-dflash-b16", {"hidden_act": "silu}"}, "the drafter does not build from it: KeyError 'silu}'"),
    ("tiny-dflash-b16", {"intermediate_size": 300}, "the weights do not match config.json: "
     "layers.0.mlp.down_proj.weight is [256, 640] in the weights, [256, 300] by config.json"),
    ("tiny-eagle3", {"rope_parameters": 3}, "the drafter does not build from it"),
    ("tiny-dspark-b15", {"num_attention_heads": "4"}, "the drafter does not build from it: Validation error "
     "for field 'num_attention_heads'"),
], ids=["missing-layers", "oversized", "target-shapes", "draft-model-shapes", "chat-stop", "specials",
        "dflash-act", "dflash-shapes", "eagle3-rope", "dspark-heads"])
def test_a_checkpoint_config_json_that_does_not_build_is_named(tmp_path, shipped, edit, message):
    """`build` of a deployment whose checkpoint's config.json was edited: one Error: line naming that
    config.json (or its folder) and what is wrong, no output left."""
    folder = tmp_path / shipped
    folder.mkdir()
    for path in (ASSETS_DIR / shipped).iterdir():
        if path.name != "config.json":
            (folder / path.name).symlink_to(path)
    raw = json.loads((ASSETS_DIR / shipped / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **edit}))
    drafter = {"tiny-target": "dflash", "tiny-dflash-b16": "dflash", "tiny-draft": "draft_model",
               "tiny-eagle3": "eagle3", "tiny-dspark-b15": "dspark"}[shipped]
    paths = {"tiny-target": "builtin:tiny-target",
             "drafter": {"dflash": "builtin:tiny-dflash-b16"}.get(drafter, f"builtin:{shipped}")}
    paths["tiny-target" if shipped == "tiny-target" else "drafter"] = str(folder)
    config = tmp_path / "c.yaml"
    config.write_text(f"target: {{path: {paths['tiny-target']}}}\n"
                      f"drafter: {{method: {drafter}, path: {paths['drafter']}}}\n")
    line = assert_run_error(invoke("build", config, "--out", tmp_path / "o"), str(folder), message)
    assert "Traceback" not in line
    assert not (tmp_path / "o").exists()


def test_files_beside_a_drafter_are_replaced_whole(tmp_path, monkeypatch):
    """`calibrate` (sts.json) and `bench --write-acceptance` (acceptance.json) wrote over the stored
    file in place: stopped mid-write, the drafter was left with a file that does not parse, and
    every later load of it failed."""
    import pathlib

    from trtspec.bench.acceptance import write_acceptance
    from trtspec.spec.cost import ACCEPTANCE_FILE
    from trtspec.spec.sts import STS_FILE, STSCalibration, save_sts

    shutil.copy(ASSETS_DIR / "tiny-dspark-b15" / STS_FILE, tmp_path / STS_FILE)
    calibration = STSCalibration.model_validate_json((tmp_path / STS_FILE).read_text())
    write_acceptance(tmp_path, [0.5, 0.25], 100, "first")
    before = {name: (tmp_path / name).read_text() for name in (STS_FILE, ACCEPTANCE_FILE)}
    real = pathlib.Path.write_text

    def interrupted(self, data, *args, **kwargs):
        real(self, data[: len(data) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(pathlib.Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_sts(calibration, tmp_path)
    with pytest.raises(KeyboardInterrupt):
        write_acceptance(tmp_path, [0.9, 0.8], 200, "second")
    monkeypatch.undo()
    assert {name: (tmp_path / name).read_text() for name in before} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(before)


@pytest.mark.parametrize(("limits", "named"), [
    ("max_tokens: 1000000000000",
     "field `limits.max_tokens`: Input should be less than or equal to 16777216"),
    # the tiny target has 4,096 positions: no request could ask for these and bring a prompt
    ("max_tokens: 4096", "limits.max_tokens 4096 leaves no room in the target's context of 4096 positions"),
    ("max_tokens: 16\n  max_input_tokens: 5000", "limits.max_input_tokens 5000 leaves no room"),
])
def test_limits_no_request_could_reach_are_refused_at_build(tmp_path, limits, named):
    """`max_tokens: 1e12` (or 4,096 on a 4,096-position target) built a deployment that refused
    every request asking for its limit; now build names the field and the range, writing nothing."""
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG.read_text().replace("max_tokens: 2048", limits))
    out = tmp_path / "out"
    result = invoke("build", config, "--out", out)
    assert result.exit_code in (1, 2) and "Traceback" not in result.output, result.output
    assert named in result.output, result.output
    if "leaves no room" in named:
        assert "expected [1, 4095]" in result.output
    assert not out.exists()


# -- found fuzzing the CLI (2026-12-05) -------------------------------------------------------------


def test_a_setting_too_large_for_the_machine_is_one_line_not_a_traceback(tmp_path):
    """`train target --steps 2**63` was an OverflowError's traceback (tqdm's counter); torch's
    allocator refusing `--layers 100000` or `profile --requests 10**8` a RuntimeError's. Each is one
    `Error:` line now that says what and suggests the cause, and nothing is written."""
    line = assert_run_error(invoke("train", "target", "--out", tmp_path / "t", "--steps", 2**63),
                            "OverflowError", "a setting too large for this machine?")
    assert "Python int too large" in line
    assert not (tmp_path / "t").exists()


def test_verify_refuses_what_the_server_would_refuse_or_never_end(tmp_path):
    """--max-tokens past limits.max_tokens reached the server as an int32 (3e9 as -1294967296, in
    the server's words); --samples 2**63 never ended; a prompt holding half a surrogate pair was
    'utf-8' codec's words without the file."""
    build = tmp_path / "b"
    assert invoke("build", REPO / "build_configs" / "tiny-lookup.yaml", "--out", build).exit_code == 0
    assert_usage_error(invoke("verify", build, "--max-tokens", 3_000_000_000, "--samples", 0),
                       "--max-tokens", "must be in [1, 2048] (limits.max_tokens of", "got 3000000000")
    assert_usage_error(invoke("verify", build, "--samples", 2**63), "--samples", "at most 1,000,000")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "fine"}\n{"prompt": "a\\ud800"}\n')
    assert_usage_error(invoke("verify", build, "--prompts", prompts, "--samples", 0), "--prompts",
                       f"{prompts}:2: a string holds half a UTF-16 surrogate pair")


def test_a_conversation_the_chat_template_refuses_names_the_prompts_file(tmp_path):
    prompts = tmp_path / "m.jsonl"
    prompts.write_text('{"messages": [{"role": "bogus", "content": "hi"}]}\n')
    assert_run_error(invoke("train", "dflash", "--target", "builtin:tiny-target", "--prompts", prompts,
                            "--response-tokens", 8, "--max-steps", 1, "--out", tmp_path / "d"),
                     f"{prompts}: the chat template refused conversation 1")


def test_a_diverged_training_run_is_refused_not_saved(tmp_path):
    """`train target --lr 1e12` wrote NaN weights and a training.json holding NaN, exit 0."""
    assert_usage_error(invoke("train", "target", "--out", tmp_path / "t", "--steps", 1, "--lr", 1e12),
                       "--lr", "training diverged (the loss is nan at step 1)")
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("name, text, said", [
    ("p.json", '[{"prompt": "a"}]\n', "p.json:1: expected a JSON object with a 'prompt' string"),  # was text
    ("p.jsonl", '{"prompt": "a"}\n{"prompt": ""}\n', "p.jsonl:2: the prompt is empty"),
])
def test_prompts_files_are_read_as_their_name_says(tmp_path, name, text, said):
    prompts = tmp_path / name
    prompts.write_text(text)
    result = invoke("verify", "--url", "grpc://127.0.0.1:1", "--config", CONFIG, "--prompts", prompts)
    assert_usage_error(result, "--prompts", said)


@pytest.mark.parametrize("args, named", [
    (["--max-tokens", "4294967304"], "max_tokens 4294967304"),  # asked the server for 8 tokens
    (["--top-k", "4294967297", "--temperature", "1.5"], "top_k 4294967297"),  # sampled with top_k 1
    (["--max-tokens", "2147483648"], "max_tokens 2147483648"),  # refused as "got -2147483648"
])
def test_integers_past_the_models_int32_inputs_are_refused_before_sending(args, named):
    """Found fuzzing the client flags (2026-12-05): numpy and Triton's JSON front end wrap an
    integer past int32 silently. Refused before any connection (port 1: nothing listens)."""
    for scheme in ("grpc", "http"):
        result = invoke("generate", "--url", f"{scheme}://127.0.0.1:1", "--prompt", "hi", *args)
        assert_run_error(result, named, "past the model's int32 input")


def test_a_port_that_answers_no_http_is_named_not_a_traceback():
    """Found fuzzing the client flags (2026-12-05): http:// or openai:// at Triton's gRPC port was an
    http.client.BadStatusLine traceback. A socket answering HTTP/2 frame bytes stands in for it."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        for _ in range(2):
            conn, _ = listener.accept()
            conn.recv(65536)
            conn.sendall(b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00\x3f\xff\xff\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        for scheme in ("http", "openai"):
            result = invoke("generate", "--url", f"{scheme}://127.0.0.1:{port}", "--prompt", "hi",
                            "--max-tokens", "4")
            assert_run_error(result, "no HTTP answer came", "is it a gRPC port?")
    finally:
        listener.close()


def test_what_the_served_model_reads_at_load_is_checked_by_build_and_bench(tmp_path):
    """Found fuzzing build configs (2026-12-05): a schedule.sps_table that is no table and an
    acceptance.json of rates outside [0, 1] (or not UTF-8) built, then failed to load under serve
    after 25 s (or, the rates, were taken as probabilities); bench read the table only after its
    single-stream runs."""
    drafter = tmp_path / "d"
    shutil.copytree(ASSETS_DIR / "tiny-dflash-b16", drafter)
    config = tmp_path / "c.yaml"
    text = CONFIG.read_text().replace("builtin:tiny-dflash-b16", str(drafter))
    config.write_text(text)
    for body, said in (
        ('{"acceptance_by_position": [0.9, 5, -1]}', "must be rates in [0, 1], one or more, got 5"),
        ('{"acceptance_by_position": [0.9, "nan"]}', "got 'nan'"),
        (b"\xff\xfe{}", "'utf-8' codec can't decode"),
    ):
        (drafter / "acceptance.json").write_bytes(body if isinstance(body, bytes) else body.encode())
        for args in (["build", config, "--out", tmp_path / "o"],
                     ["bench", config, "--prompts", "1", "--max-tokens", "4", "--out", tmp_path / "b"]):
            assert_run_error(invoke(*args), f"{drafter / 'acceptance.json'}: ", said)
    shutil.copy(ASSETS_DIR / "tiny-dflash-b16" / "acceptance.json", drafter)
    config.write_text(text.replace("drafter:\n", f"drafter:\n  schedule: {{sps_table: {config}}}\n", 1))
    for args in (["build", config, "--out", tmp_path / "o"],
                 ["bench", config, "--prompts", "1", "--max-tokens", "4", "--out", tmp_path / "b"]):
        assert_run_error(invoke(*args), "drafter.schedule.sps_table: ", "not an SPS table")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "d"]


def test_checkpoint_and_build_files_that_are_no_text_are_named(tmp_path):
    """Found fuzzing build configs (2026-12-05): a chat template not in UTF-8 was Python's words
    alone, a generation_config.json not in UTF-8 was blamed on config.json, a garbage manifest.json
    was "Internal: JSONDecodeError" under serve."""
    from trtspec.errors import ConfigError
    from trtspec.export.bundle import MANIFEST, load_manifest

    for name, said in (("chat_template.jinja", "chat_template.jinja: not UTF-8 text (byte 0)"),
                       ("generation_config.json", "generation_config.json is not a JSON object")):
        target = tmp_path / name / "tgt"
        shutil.copytree(ASSETS_DIR / "tiny-target", target)
        (target / name).write_bytes(b"\xff\xfe{}")
        config = tmp_path / name / "c.yaml"
        config.write_text((REPO / "build_configs" / "tiny-lookup.yaml").read_text().replace(
            "builtin:tiny-target", str(target)))
        result = invoke("generate", "--config", config, "--prompt", "hi", "--max-tokens", "4", "--chat")
        assert_run_error(result, f"{target / name}", said)
    (tmp_path / MANIFEST).write_text("{garbage")
    with pytest.raises(ConfigError, match=f"{tmp_path / MANIFEST} is not an engine build's manifest"):
        load_manifest(tmp_path)


def test_an_ipv6_url_reaches_its_host_and_a_path_after_the_port_is_refused():
    """Found fuzzing the client flags (2026-12-05): grpc://[::1]:PORT lost its brackets ("Misformatted
    domain name"), and grpc://HOST:PORT/x dropped the /x without a word."""
    from trtspec.openai.client import base_url
    from trtspec.triton.client import split_url

    assert split_url("grpc://[::1]:8001") == ("grpc", "[::1]:8001")
    assert base_url("openai://[::1]:9000/") == "http://[::1]:9000/v1"
    result = invoke("generate", "--url", "grpc://[::1]:1", "--prompt", "hi", "--max-tokens", "2")
    assert_run_error(result, "cannot reach grpc://[::1]:1", "Connection refused")  # nothing listens there
    for url in ("grpc://127.0.0.1:1/x", "openai://127.0.0.1:1/v1", "http://127.0.0.1:1?a=1"):
        result = invoke("generate", "--url", url, "--prompt", "hi")
        assert result.exit_code != 0 and "expected no path after HOST:PORT" in result.output, result.output


@pytest.mark.parametrize(("raw", "api", "own"), [
    (b'{"object": "error", "message": "The model `x` does not exist.", "code": 404}', "openai", True),  # vLLM
    (b'{"error": {"message": "The model `x` does not exist."}}', "openai", True),  # OpenAI, trtspec
    (b'{"detail": "Not Found"}', "openai", False),  # a FastAPI server's unknown route
    (b'{"error": "Not Found"}', "openai", False), (b"Not Found", "openai", False), (b"[1]", "openai", False),
    (b'{"error": "Request for unknown model: \'x\' is not found"}', "triton", True),
    (b'{"error": {"message": "Invalid URL"}}', "triton", False),  # trtspec's OpenAI port
])
def test_a_404_in_the_apis_own_words_gets_no_hint_of_another_port(raw, api, own):
    """Found reviewing the port hints (2026-12-06): vLLM's and SGLang's unknown-model 404 is
    {"object": "error", ...}, and a mistyped --model was told "is it Triton's HTTP port?"."""
    from trtspec.triton.client import _api_error

    assert _api_error(raw, api) is own


def test_ctrl_c_stops_a_command_with_one_line_and_exit_130(tmp_path):
    """A real SIGINT to the command's process group, as a terminal's Ctrl-C sends it, mid-run (train
    target, after its first step): click printed "Aborted!" and exited 1, a failure's status; now one
    line and 130 (128 + SIGINT), as a shell reports a stopped command, and nothing is written."""
    command = ["train", "target", "--out", str(tmp_path / "t"), "--steps", "100000"]
    proc = subprocess.Popen([sys.executable, "-m", "trtspec.cli", *command], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, preexec_fn=default_ctrl_c)
    try:
        seen = b""
        while b"1/100000" not in seen:  # tqdm's bar after the first step: mid-run
            chunk = proc.stderr.read1(4096)
            assert chunk, seen.decode()[-2000:]
            seen += chunk
        os.killpg(proc.pid, signal.SIGINT)
        out, rest = proc.communicate(timeout=60)
        err = (seen + rest).decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.rstrip().endswith("Interrupted (Ctrl-C).") and "Traceback" not in err and "Aborted" not in err
    assert not (tmp_path / "t").exists() and not out


@pytest.mark.parametrize("args, option", [
    (["bench", CONFIG, "--prompts", 1, "--max-tokens", 4, "--out", ""], "--out"),
    (["bench", CONFIG, "--prompts", 1, "--max-tokens", 4, "--doc", ""], "--doc"),
    (["profile", CONFIG, "--out", ""], "--out"),
    (["build", CONFIG, "--out", ""], "--out"),
    (["train", "target", "--out", ""], "--out"),
    (["serve", ""], "DIR"),
])
def test_an_empty_path_is_refused_naming_its_option(tmp_path, monkeypatch, args, option):
    """`bench --out "$OUT"` with OUT unset wrote results.json, results.md and its figures into the
    current folder (Path("") is "."); an empty path is a usage error naming the option now."""
    monkeypatch.chdir(tmp_path)
    assert_usage_error(invoke(*args), option, "an empty path")
    assert not any(tmp_path.iterdir())


def test_an_existing_output_file_may_be_replaced_and_a_ranges_ends_are_in_it(tmp_path):
    """`--out FILE` over a file written before is replaced (its folder is what must be writable);
    `check_range`'s bounds are inclusive at both ends (`--temperature 2`, `--bins 1000`)."""
    import click

    from trtspec.cli_errors import check_range, writable_arg

    existing = tmp_path / "profile.json"
    existing.write_text("{}")
    writable_arg(existing, "--out", folder=False)
    writable_arg(tmp_path, "--out", folder=True)
    with pytest.raises(click.BadParameter, match="is a folder; give a file"):
        writable_arg(tmp_path, "--out", folder=False)
    for value in (2, 1000):
        check_range(value, "--bins", low=2, high=1000)
    for value in (1, 1001):
        with pytest.raises(click.BadParameter, match=rf"must be in \[2, 1000\], got {value}"):
            check_range(value, "--bins", low=2, high=1000)


def test_an_allowed_origin_as_a_browser_sends_it_is_taken():
    from trtspec.openai.cors import check_origin

    for origin in ("*", "http://localhost:5173", "https://app.example.com", "http://[::1]:8000"):
        assert check_origin(origin) == origin


def test_a_build_output_that_is_a_pipe_is_refused_and_one_under_missing_folders_is_made(tmp_path):
    """--out names a folder: anything else there (a named pipe, not only a file) is refused before
    any work; a folder under folders not made yet is made, with them, and holds the build's files
    and its marker."""
    from trtspec.output import OutputError, check_replaceable, staged_output

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(OutputError, match=f"--out {pipe} is a file; give a folder"):
        check_replaceable(pipe)
    out = tmp_path / "a" / "b" / "out"
    with staged_output(out) as staged:
        (staged / "model.txt").write_text("built")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "model.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "pipe"]  # no staging folder left


def test_path_and_port_types_take_their_kind_and_refuse_the_other(tmp_path):
    """The shared argument types: a folder option refuses a file, a file option a folder and a
    missing path, and a port is any of 1..65535 (1 and 65535 included)."""
    import click

    from trtspec.cli.common import EXISTING_DIR, EXISTING_FILE, PORT

    file = tmp_path / "prompts.jsonl"
    file.write_text("{}\n")
    assert EXISTING_DIR.convert(str(tmp_path), None, None) == tmp_path
    assert EXISTING_FILE.convert(str(file), None, None) == file
    for kind, value, message in ((EXISTING_DIR, file, "is a file"),
                                 (EXISTING_FILE, tmp_path, "is a directory"),
                                 (EXISTING_FILE, tmp_path / "none.jsonl", "does not exist")):
        with pytest.raises(click.BadParameter, match=message):
            kind.convert(str(value), None, None)
    assert [PORT.convert(p, None, None) for p in ("1", "65535")] == [1, 65535]
    for bad in ("0", "65536"):
        with pytest.raises(click.BadParameter):
            PORT.convert(bad, None, None)


def test_a_url_with_a_space_after_its_colon_is_refused_in_one_clause():
    """The client's message for a bad --url is cut to what was expected after the option it names
    (click names the option itself): a ": " inside the URL does not cut the message there."""
    result = invoke("generate", "--url", "http://host: 8000", "--prompt", "hi")
    assert_usage_error(result, "--url")
    out = result.output
    assert "Invalid value for --url: expected grpc://HOST:PORT" in out, out
    assert "got 'http://host: 8000'" in out, out


def test_integer_lists_refuse_any_value_below_the_low_end():
    """A comma-separated integer option (--concurrency, --batches) refuses a list with any value
    below its low end, wherever it stands; the low end itself passes, and a repeat only where each
    value must be distinct."""
    import click

    from trtspec.cli.common import int_list

    assert int_list("1,8,2", "--concurrency") == [1, 8, 2]
    assert int_list("0,3", "--layers", low=0) == [0, 3]
    assert int_list("4,4", "--layers", distinct=False) == [4, 4]
    for text, low, message in (("4,0", 1, "values must be >= 1, got '4,0'"), ("2,1", 2, ">= 2"),
                               ("4,4", 1, "4 given twice")):
        with pytest.raises(click.BadParameter, match=message):
            int_list(text, "--concurrency", low=low)


def test_a_wait_under_a_second_still_polls_the_server():
    """--wait 0.2 waits for the server (any wait above 0 does): the failure says what was not
    ready and that nothing answered, not the plain `cannot reach` of a request sent at once."""
    url = f"http://127.0.0.1:{closed_port()}"
    line = assert_run_error(invoke("generate", "--url", url, "--wait", "0.2", "--prompt", "hi"),
                            "'trtspec'", "not ready within 0.2s", "connection refused")
    assert "cannot reach" not in line, line
