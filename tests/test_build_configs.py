"""Every file in build_configs/ builds as its README row says, on this CPU machine without weights.

A config missing from EXPECTED fails the test: a new config must say what `build` does with it.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import ASSETS_DIR, load_build_config

from .conftest import REPO

CONFIGS = sorted((REPO / "build_configs").glob("*.yaml"))
TORCH = "builds a Triton repository (any CPU)"
TRTLLM = "builds TensorRT-LLM artifacts without weights"
ENGINE = "exports where the checkpoints are; without them names the missing folder"
EXPECTED = {
    "tiny-dflash.yaml": TORCH,
    "tiny-dspark.yaml": TORCH,
    "tiny-eagle3.yaml": TORCH,
    "tiny-eagle3-k16.yaml": TORCH,
    "tiny-draft-model.yaml": TORCH,
    "tiny-lookup.yaml": TORCH,
    "tiny-dflash-lookup.yaml": TORCH,
    "tiny-lookup-pool.yaml": TORCH,
    "tiny-dflash-lookup-pool.yaml": TORCH,
    "qwen3-8b-dflash-h200.yaml": ENGINE,
    "qwen3-8b-eagle3.yaml": TRTLLM,
    "llama3.1-8b-dflash.yaml": TRTLLM,
    "gpt-oss-120b-dflash-b300-tp8.yaml": TRTLLM,
    "deepseek-v4-flash-dspark.yaml": TRTLLM,
}


def test_every_config_has_an_expectation():
    assert sorted(p.name for p in CONFIGS) == sorted(EXPECTED)


def test_readme_lists_every_config_with_its_flavour():
    readme = (REPO / "README.md").read_text()
    for path in CONFIGS:
        assert f"`{path.name}`" in readme or f"`build_configs/{path.name}`" in readme, path.name
        flavour = load_build_config(path).flavour
        if EXPECTED[path.name] != TORCH:  # the real-model table has a flavour column
            row = next(line for line in readme.splitlines() if line.startswith(f"| `{path.name}`"))
            assert row.split("|")[2].strip() == flavour, row


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_as_the_readme_says(tmp_path, path):
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(out)])
    config = load_build_config(path)
    expected = EXPECTED[path.name]
    if expected == TORCH:
        assert result.exit_code == 0, result.output
        assert (out / "model_repository" / config.name / "config.pbtxt").is_file()
    elif expected == TRTLLM:
        assert result.exit_code == 0, result.output
        for name in ("plan.json", "trtllm-serve.yaml", "deploy/launch.sh", "deploy/k8s.yaml",
                     f"triton/{config.name}/config.pbtxt"):
            assert (out / name).is_file(), name
    else:
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [
            f"Error: target checkpoint {config.target.resolved_path} is not here: flavour engine exports its "
            "graphs from the weights, so build where they are (`trtspec inspect` plans without them)"]
        assert not out.exists()


def test_engine_config_builds_where_its_checkpoints_are(tmp_path):
    """qwen3-8b-dflash-h200.yaml as written (float16, DFlash, 15 drafts), with the embedded target
    and DFlash drafter standing in for the 8B checkpoints under weights/."""
    config_path = shutil.copy(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml", tmp_path)
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "Qwen3-8B").symlink_to(ASSETS_DIR / "tiny-target")
    (tmp_path / "weights" / "Qwen3-8B-DFlash-b16").symlink_to(ASSETS_DIR / "tiny-dflash-b16")
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["build", str(config_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["precision"] == "float16"
    assert manifest["drafter"]["method"] == "dflash" and manifest["drafter"]["num_draft_tokens"] == 15
    assert (out / "model_repository" / "qwen3-8b-dflash" / "config.pbtxt").is_file()
