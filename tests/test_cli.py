"""The CLI: `generate --json` on the embedded default, and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import main

from .conftest import REPO

CONFIG = str(REPO / "build_configs" / "tiny-draft-model.yaml")


def run(*args: str) -> subprocess.CompletedProcess:
    """The installed entry point in a real process, as a user runs it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "trtspec.cli", *args], capture_output=True,
                          text=True, timeout=300, env=env, cwd=REPO)


def test_generate_json_speculative_equals_none():
    args = ["generate", "--config", CONFIG, "--prompt", "Q: 12 + 34\nA:", "--max-tokens", "40", "--json"]
    spec, none = (CliRunner().invoke(main, args + extra) for extra in ([], ["--drafter", "none"]))
    assert spec.exit_code == 0 and none.exit_code == 0, spec.output + none.output
    a, b = json.loads(spec.stdout), json.loads(none.stdout)
    for key in ("text", "token_ids", "tau", "num_target_calls", "decode_tokens_per_s"):
        assert key in a
    assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
    assert b["tau"] == 1.0 and b["num_target_calls"] == len(b["token_ids"])
    assert a["tau"] > 1.0 and a["drafter"] == "draft_model"
    assert a["finish_reason"] == b["finish_reason"] == "length"  # 40 tokens, no end among them


CODE = "def parse(self, text):\n"  # a prompt the tiny target is unsure after: options move its text


def _token_ids(max_tokens: int, *variants: list[str]) -> list[list[int]]:
    """`generate --json` of CODE once per variant of extra options: each run's token ids."""
    args = ["generate", "--config", CONFIG, "--prompt", CODE, "--max-tokens", str(max_tokens), "--json"]
    runs = [CliRunner().invoke(main, args + extra) for extra in variants]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    return [json.loads(r.stdout)["token_ids"] for r in runs]


def _assert_refused(option: str, value: str) -> None:
    bad = CliRunner().invoke(main, ["generate", "--config", CONFIG, "--prompt", CODE, option, value])
    assert bad.exit_code == 2 and option in bad.output and value in bad.output


def test_generate_with_penalties_speculative_equals_none():
    """--presence/frequency/repetition-penalty change the text, the same with the drafter as without;
    one out of range is refused naming its option."""
    penalties = ["--presence-penalty", "0.6", "--frequency-penalty", "0.3", "--repetition-penalty", "1.2"]
    plain, spec, none = _token_ids(40, [], penalties, [*penalties, "--drafter", "none"])
    assert spec == none != plain
    _assert_refused("--presence-penalty", "2.5")


def test_generate_min_p_of_one_keeps_only_the_most_likely_token():
    """--min-p 1 leaves only the argmax: sampled at any temperature, the greedy text; without it the
    same seed samples another; out of [0, 1] it is refused naming its option."""
    hot = ["--temperature", "1.5", "--seed", "3"]
    greedy, top_only, sampled = _token_ids(32, [], [*hot, "--min-p", "1"], hot)
    assert top_only == greedy != sampled
    _assert_refused("--min-p", "1.5")


GUIDE_REGEX = r"    [a-z]+ = [0-9]+\n"


def test_generate_with_a_guide_speculative_equals_none(tmp_path):
    """--guide-type / --guide: the text is in the guide's language and the same with the drafter as
    without; a schema read from @FILE; a bad guide or a guide without its type is refused naming
    --guide."""
    guide = ["--guide-type", "regex", "--guide", GUIDE_REGEX]
    plain, spec, none = _token_ids(40, [], guide, [*guide, "--drafter", "none"])
    assert spec == none != plain
    assert re.fullmatch(GUIDE_REGEX, bytes(spec[:-1]).decode()) and spec[-1] == 256  # ended by the eos
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"n": {"type": "integer"}},
                                  "required": ["n"]}))
    from_file, = _token_ids(40, ["--guide-type", "json_schema", "--guide", f"@{schema}"])
    assert bytes(from_file).decode().lstrip().startswith("{")
    missing = f"@{tmp_path / 'none.json'}"
    for args, message in ((["--guide-type", "regex", "--guide", "[0-9"], "Unclosed '['"),
                          (["--guide", "[0-9]"], "needs --guide-type"),
                          (["--guide-type", "json_schema", "--guide", missing], "none.json")):
        bad = CliRunner().invoke(main, ["generate", "--config", CONFIG, "--prompt", CODE, *args])
        assert bad.exit_code == 2 and "--guide" in bad.output and message in bad.output, bad.output


def test_sampled_generate_names_the_seed_that_repeats_it():
    """Without --seed a sampled request draws one; the summary line names it, and --seed repeats
    the text (the target alone here: under rejection sampling the schedule must repeat too)."""
    args = ["generate", "--config", CONFIG, "--prompt", "import os", "--max-tokens", "24",
            "--drafter", "none"]
    runner = CliRunner()
    first = runner.invoke(main, [*args, "--temperature", "0.8"])
    assert first.exit_code == 0, first.output
    seed = re.fullmatch(r"\[none\] tau=.* seed=(\d+)", first.stderr.strip()).group(1)
    again = runner.invoke(main, [*args, "--temperature", "0.8", "--seed", seed])
    assert again.stdout == first.stdout and again.stderr.strip().endswith(f" seed={seed}")
    other = runner.invoke(main, [*args, "--temperature", "0.8", "--seed", str(int(seed) + 1)])
    assert other.stdout != first.stdout
    assert "seed=" not in runner.invoke(main, args).stderr  # greedy: no seed


def test_every_command_has_help():
    runner = CliRunner()
    for args in ([], ["generate"], ["train"], ["train", "target"]):
        result = runner.invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, args


def test_generate_takes_max_tokens_from_one_to_the_configs_limit(tmp_path):
    """--max-tokens is any of 1..limits.max_tokens, both ends included; one past the limit is a
    usage error naming the limit."""
    config = tmp_path / "limited.yaml"
    config.write_text(Path(CONFIG).read_text().replace("max_tokens: 2048", "max_tokens: 4"))
    runner = CliRunner()
    args = ["generate", "--config", str(config), "--prompt", "import os", "--drafter", "none", "--json"]
    for n in (1, 4):
        result = runner.invoke(main, [*args, "--max-tokens", str(n)])
        assert result.exit_code == 0, result.output
        assert len(json.loads(result.stdout)["token_ids"]) == n, result.stdout  # "import os" runs on
    over = runner.invoke(main, [*args, "--max-tokens", "5"])
    assert over.exit_code == 2 and "must be in [1, 4] (limits.max_tokens" in over.output, over.output


def test_generate_help_shows_the_defaults_a_plain_run_takes():
    """`generate --help` names each default a run without the option takes: the drafter (the
    config's), the served model's name and the greedy sampling settings."""
    text = " ".join(CliRunner().invoke(main, ["generate", "--help"]).output.split())
    for default in ("through the same target. [default: config]", "(with --url). [default: trtspec]",
                    "0 = greedy; > 0 samples. [default: 0.0]", "Most tokens to generate. [default: 128]"):
        assert default in text, default


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt", ""], "--prompt"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--temperature", "-1"], "--temperature"),
        # inf would sample uniformly (every draft accepted), nan nothing: neither is a temperature
        (["--temperature", "inf"], "--temperature: Input should be a finite number, got inf"),
        (["--temperature", "nan"], "--temperature: Input should be a finite number, got nan"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "-2"], "--top-k"),
        (["--max-tokens", "100000"], "Invalid value for --max-tokens: must be in [1, 2048] (limits.max"),
    ],
)
def test_bad_request_parameters(args, message):
    base = {"--prompt": "hello", "--max-tokens": "8"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    flat = [x for kv in base.items() for x in kv]
    result = CliRunner().invoke(main, ["generate", "--config", CONFIG, *flat])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "content,message,code",
    [
        # the config file is the argument: missing or invalid is a usage error (exit 2, usage shown)
        (None, "does not exist", 2),
        ("target: [oops\n", "not valid YAML", 2),
        ("target: {path: builtin:tiny-target}\nflavour: gpu\n", "field `flavour`", 2),
        # a checkpoint that will not load is a run-time failure (exit 1, one line, no usage)
        ("target: {path: nowhere}\n", "does not exist", 1),
        ("target: {path: empty}\n", "has no weights", 1),
        # the field and where its relative path led (they said "checkpoint directory c.yaml does not
        # exist" of a file, and "nope/config.json is missing" of a drafter folder that is not there)
        ("target: {path: c.yaml}\n", "target.path 'c.yaml' is ", 1),
        ("target: {path: builtin:tiny-target}\ndrafter: {method: dflash, path: nope}\n",
         "drafter.path 'nope' is ", 1),
    ],
)
def test_bad_config_or_checkpoint(tmp_path, content, message, code):
    path = tmp_path / "c.yaml"
    if content is not None:
        path.write_text(content)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text("{}")
    args = ["generate", "--config", str(path), "--prompt", "x", "--max-tokens", "4"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit)  # click's one-line error, not an escaped exception
    assert message in result.stderr and str(tmp_path) in result.stderr
    assert ("Usage:" in result.stderr) == (code == 2)
    if "path '" in message:
        assert "(a relative path starts at the YAML's folder), which" in result.stderr
        assert ("is a file, not a checkpoint folder" in result.stderr) == ("c.yaml" in message)
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1


def test_bad_config_through_the_entry_point(tmp_path):
    """As a user meets it, in its own process: one `Error:` line, usage, no traceback; and the file
    is named before torch and the models load (a second, not the ~6 s they take)."""
    path = tmp_path / "c.yaml"
    path.write_text("target: [oops\n")
    proc = run("generate", "--config", str(path), "--prompt", "x", "--max-tokens", "4")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Usage:" in proc.stderr and str(tmp_path) in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if line.startswith("Error")]) == 1
    probe = ("import runpy, sys\n"
             f"sys.argv = ['trtspec', 'generate', '--config', {str(path)!r}, '--prompt', 'x']\n"
             "try:\n    runpy.run_module('trtspec.cli', run_name='__main__')\n"
             "except SystemExit as exit:\n    print(exit.code, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.stdout.split() == ["2", "False"], out.stdout + out.stderr


@pytest.mark.parametrize("command, model, renamed", [
    ("target", "trtspec.train.pretrain.PretrainConfig", {}),
    ("dflash", "trtspec.train.dflash.DFlashTrainConfig", {"layers": "num_layers"}),
    ("dspark", "trtspec.train.dspark.DSparkTrainConfig", {"layers": "num_layers"}),
    ("eagle3", "trtspec.train.eagle3.Eagle3TrainConfig", {}),
])
def test_train_help_states_the_bounds_the_config_enforces(command, model, renamed):
    """Each option's help gives the range its train config refuses outside of (--response-tokens 4
    was refused with '>= 8', which its help did not say)."""
    import importlib

    from annotated_types import Ge, Gt, Le

    module, name = model.rsplit(".", 1)
    fields = getattr(importlib.import_module(module), name).model_fields
    cmd = main.commands["train"].commands[command]
    checked = 0
    for param in cmd.params:
        field = fields.get(renamed.get(param.name, param.name))
        if field is None or not param.help:
            continue
        bounds = {type(m): m for m in field.metadata if isinstance(m, (Ge, Gt, Le))}
        if Ge in bounds and Le in bounds:
            want = f"in [{bounds[Ge].ge:g}, {bounds[Le].le:g}]"
        elif Ge in bounds:
            want = f">= {bounds[Ge].ge:g}"
        elif Gt in bounds:
            want = f"> {bounds[Gt].gt:g}"
        else:
            continue
        assert want in param.help, (param.opts[0], want, param.help)
        checked += 1
    assert checked >= 2


def test_a_chat_template_that_is_no_jinja_is_refused_at_build(tmp_path):
    """Found fuzzing (2026-12-05): such a checkpoint built and served, and every chat request was then
    refused as if its messages were at fault. `build` names the file and the line, and writes nothing."""
    from pathlib import Path

    from trtspec.config import load_build_config

    from .conftest import local_target

    config = load_build_config(REPO / "build_configs" / "tiny-lookup.yaml")
    local = local_target(tmp_path, config, "{% for m in messages %}{{ m.content }}\n{% if %}x{% endif %}")
    path = tmp_path / "c.yaml"
    path.write_text((REPO / "build_configs" / "tiny-lookup.yaml").read_text()
                    .replace("builtin:tiny-target", local.target.path))
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(tmp_path / "out")])
    template = Path(local.target.path) / "chat_template.jinja"
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())  # click wraps the line
    assert f"{template}: the chat template is not valid Jinja (line 2): Expected an expression" in said
    assert not (tmp_path / "out").exists()
