"""A fuzzer of what `trtspec build` and `trtspec inspect` read: build configs (every YAML of
build_configs/ and a tiny one with most fields set) and checkpoints' config.json (the embedded
target and drafters; a DFlash and a DSpark drafter shaped for Llama-3.1-8B, which the trtllm build
converts to TensorRT-LLM's layout), each mutated at one to three random places (tests/mutate.py).

What must hold for every input: the command exits 0, or 1 with one `Error:` line (2 with usage for a
CONFIG it cannot read), never a traceback; a failed `build` leaves no output folder behind.
`python -m tests.config_fuzz --runs N` runs it; tests/test_config_fuzz.py runs a few hundred.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path

import yaml
from click.testing import CliRunner

from trtspec.cli import main as cli
from trtspec.config import ASSETS_DIR

from .conftest import REPO
from .mutate import Mutator

# the tiny deployment with most of its fields set: the mutations' best reach
RICH = {
    "name": "trtspec", "flavour": "torch",
    "target": {"path": "builtin:tiny-target", "dtype": "float32", "device": "cpu", "cuda_graphs": True},
    "drafter": {"method": "dflash", "path": "builtin:tiny-dflash-b16", "num_draft_tokens": 15,
                "schedule": {"mode": "adaptive", "threshold": 0.5, "min_gain": 0.0, "probe_every": 16},
                "tree": {"nodes": 32, "topk": 4, "depth": 8}},
    "limits": {"max_tokens": 256, "max_input_tokens": 512, "max_concurrency": 8, "prefill_chunk": 64,
               "prefix_reuse": True},
    "runtime": {"threads": 1}, "sampling": {"coupling": "gumbel"}, "gpus": [],
}
CONFIGS = [yaml.safe_load(path.read_text()) for path in sorted((REPO / "build_configs").glob("*.yaml"))]
CONFIGS.append(RICH)


@dataclass
class CheckpointSeed:
    """A checkpoint whose config.json the fuzz changes, and the build config that reads it."""

    name: str
    files: str  # the embedded folder whose other files (weights) are linked beside config.json
    config_json: dict
    build: dict  # the build config, its `role` path pointing at the changed checkpoint
    role: str  # target or drafter
    relative: bool = False  # trtllm: the path relative to the build config (resolved on the nodes)


def _yaml(name: str) -> dict:
    return yaml.safe_load((REPO / "build_configs" / name).read_text())


def _json(name: str) -> dict:
    return json.loads((ASSETS_DIR / name / "config.json").read_text())


# a DFlash and a DSpark drafter shaped for Llama-3.1-8B (32 layers, hidden 4096; the embedded
# weights beside them: conversion reads the config's fields, not the tensors' shapes), converted by
# the trtllm build of build_configs/llama3.1-8b-dflash.yaml
_LLAMA_DFLASH = {**_json("tiny-dflash-b16"), "model_type": "llama", "hidden_size": 4096, "block_size": 10,
                 "num_target_layers": 32,
                 "dflash_config": {"mask_token_id": 128_000, "target_layer_ids": [1, 9, 17, 25, 29]}}
_LLAMA_DSPARK = {**_json("tiny-dspark-b15"), "hidden_size": 4096, "block_size": 7, "mask_token_id": 128_000,
                 "target_layer_ids": [1, 9, 17, 25, 29], "num_target_layers": 32}
_LLAMA_BUILD = _yaml("llama3.1-8b-dflash.yaml")
CHECKPOINTS = [
    CheckpointSeed("tiny-target", "tiny-target", _json("tiny-target"), _yaml("tiny-dflash.yaml"), "target"),
    *(CheckpointSeed(name, name, _json(name), _yaml(build), "drafter") for name, build in (
        ("tiny-dflash-b16", "tiny-dflash.yaml"), ("tiny-dspark-b15", "tiny-dspark.yaml"),
        ("tiny-eagle3", "tiny-eagle3.yaml"), ("tiny-draft", "tiny-draft-model.yaml"))),
    CheckpointSeed("llama-dflash", "tiny-dflash-b16", _LLAMA_DFLASH, _LLAMA_BUILD, "drafter", relative=True),
    CheckpointSeed("llama-dspark", "tiny-dspark-b15", _LLAMA_DSPARK,
                   {**_LLAMA_BUILD, "drafter": {**_LLAMA_BUILD["drafter"], "method": "dspark",
                                                "num_draft_tokens": 7}}, "drafter", relative=True),
]

CONFIG_MUTATOR = Mutator(
    ["torch", "engine", "trtllm", "dflash", "dspark", "eagle3", "draft_model", "builtin:tiny-dspark-b15",
     "builtin:tiny-target", "builtin:nope", "/nonexistent", "gumbel", "rejection", "full", "adaptive",
     "scheduler", "threshold", "argmax", "auto", "cuda", "cuda:7", "bfloat16", "float16", "fp8", "H100",
     "B200", "Qwen/Qwen3-8B", 16, 4096, 65536, 1.5],
    CONFIGS, ["extra", "path", "method", "schedule", "tree", "gpu", "dtype", "device", "max_tokens"])
CHECKPOINT_MUTATOR = Mutator(
    ["qwen3", "llama", "DFlashDraftModel", "Qwen3ForCausalLM", "full_attention", "sliding_attention",
     "default", "linear", "yarn", 3, 7, 263, 264, 265, 4096, [1, 2], [0, 0], [-1], [99]],
    [seed.config_json for seed in CHECKPOINTS],
    ["extra", "mask_token_id", "target_layer_ids", "block_size", "rope_scaling", "d2t", "architectures"])


@dataclass
class Outcome:
    command: str  # what ran, for the report
    exit_code: int
    problem: str  # what broke the rules, empty when nothing did


def _judge(result, out: Path | None, command: str) -> Outcome:
    output = result.output
    problem = ""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        frames = [f for f in traceback.extract_tb(result.exception.__traceback__) if "trtspec" in f.filename]
        where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
        problem = f"a traceback: {type(result.exception).__name__}: {result.exception} at {where}"
    elif "Traceback" in output:
        problem = f"a traceback in the output: {output[-1500:]}"
    elif result.exit_code == 1 and (output.count("Error: ") != 1
                                    or "\n" in output[output.index("Error: "):].rstrip()):
        problem = f"exit 1 without one Error: line at the end: {output[-600:]}"
    elif result.exit_code == 2 and "Usage:" not in output:
        problem = f"exit 2 without usage: {output[-600:]}"
    elif result.exit_code not in (0, 1, 2):
        problem = f"exit {result.exit_code}: {output[-600:]}"
    elif result.exit_code != 0 and out is not None and out.exists():
        problem = f"a failed build left {out}: {sorted(p.name for p in out.iterdir())}"
    return Outcome(command, result.exit_code, problem)


def run_config(config: dict, work: Path) -> list[Outcome]:
    """`build` and `inspect` of one config (written as YAML in `work`)."""
    path = work / "config.yaml"
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    runner = CliRunner()
    label = json.dumps(config, default=str)[:1500]
    return [_judge(runner.invoke(cli, ["build", str(path), "--out", str(out)]), out, f"build {label}"),
            _judge(runner.invoke(cli, ["inspect", str(path)]), None, f"inspect {label}")]


def run_checkpoint(seed: CheckpointSeed, config_json: dict, work: Path) -> list[Outcome]:
    """`build` and `inspect` of `seed`'s build config reading its checkpoint with `config_json` (its
    other files linked from the embedded folder)."""
    folder = work / "weights" / seed.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for path in (ASSETS_DIR / seed.files).iterdir():
        if path.name != "config.json":
            (folder / path.name).symlink_to(path)
    (folder / "config.json").write_text(json.dumps(config_json))
    config = json.loads(json.dumps(seed.build))
    config[seed.role]["path"] = str(folder.relative_to(work) if seed.relative else folder)
    outcomes = run_config(config, work)
    for outcome in outcomes:
        command = outcome.command.split()[0]
        outcome.command = f"{command} with {seed.name}/config.json {json.dumps(config_json)[:1500]}"
    return outcomes


def fuzz(runs: int, seed: int, work: Path, max_mutations: int = 3):
    """`runs` mutated inputs, half configs, half checkpoints; yields each command's Outcome."""
    rng = random.Random(seed)
    for _ in range(runs):
        count = 1 if rng.random() < 0.5 else rng.randint(2, max_mutations)
        if rng.random() < 0.5:
            yield from run_config(CONFIG_MUTATOR.mutate(rng, rng.choice(CONFIGS), count), work)
        else:
            checkpoint = rng.choice(CHECKPOINTS)
            config_json = CHECKPOINT_MUTATOR.mutate(rng, checkpoint.config_json, count)
            yield from run_checkpoint(checkpoint, config_json, work)


def main() -> None:
    import argparse
    from collections import Counter

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    exits, problems = Counter(), 0
    with tempfile.TemporaryDirectory() as work:
        for i, outcome in enumerate(fuzz(args.runs, args.seed, Path(work))):
            exits[outcome.command.split()[0], outcome.exit_code] += 1
            if outcome.problem:
                problems += 1
                print(f"#{i} {outcome.problem}\n  {outcome.command}", flush=True)
    for (command, code), count in sorted(exits.items()):
        print(f"{command:8} exit {code}: {count}")
    print(f"{problems} problems in {args.runs} runs")


if __name__ == "__main__":
    main()
