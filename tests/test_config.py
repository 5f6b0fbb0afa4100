"""Build configs: every shipped one loads; a bad one names the field and the expectation."""

from __future__ import annotations

import pytest

from trtspec.config import load_build_config
from trtspec.errors import ConfigError

from .conftest import REPO


@pytest.mark.parametrize("path", sorted((REPO / "build_configs").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    config = load_build_config(path)
    # Real-model configs name weights resolved at deploy time; only embedded ones must exist here
    # (their loading and planning are covered in tests/test_planner.py).
    if config.target.path.startswith("builtin:"):
        assert config.target.resolved_path.is_dir()
    if config.drafter is not None and config.drafter.path.startswith("builtin:"):
        assert config.drafter.resolved_path.is_dir()


@pytest.mark.parametrize(
    "text,message",
    [
        ("target: {path: x}\nflavour: cuda\n",
         r"field `flavour`: Input should be 'torch', 'engine' or 'trtllm'"),
        ("target: {path: x}\ndrafter: {method: medusa, path: y}\n", r"field `drafter.method`"),
        ("target: {path: x}\ndrafter: {method: draft_model, path: y, num_draft_tokens: 0}\n",
         r"field `drafter.num_draft_tokens`: Input should be greater than or equal to 1, got 0"),
        ("drafter: null\n", r"field `target`: Field required"),
        ("target: {path: x, weights: z}\n", r"field `target.weights`: Extra inputs are not permitted"),
        ("target: [unclosed\n", r"not valid YAML at line"),
        ("- a\n- b\n", r"expected a mapping"),
        ("target: {path: x}\nsampling: {coupling: gumble}\n",
         r"field `sampling.coupling`: Input should be 'rejection' or 'gumbel'"),
        ("target: {path: x}\nflavour: trtllm\nsampling: {coupling: gumbel}\n",
         r"sampling.coupling gumbel needs flavour torch or engine: TensorRT-LLM verifies"),
    ],
)
def test_bad_configs(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_build_config(path)
    assert str(path) in str(info.value)


def test_missing_config(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_build_config(tmp_path / "none.yaml")


def test_relative_paths_resolve_against_the_yaml(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "c.yaml"
    path.write_text("target: {path: ../models/t}\n")
    assert load_build_config(path).target.resolved_path == tmp_path / "sub" / "../models/t"
