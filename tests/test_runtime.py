"""Thread policy (`trtspec.runtime`): what `threads: auto` picks from CPUs, weights and instances,
what overrides it, and that the CLI and the served model apply it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trtspec.config import load_build_config
from trtspec.runtime import (
    BYTES_PER_THREAD,
    cgroup_cpu_limit,
    choose_threads,
    usable_cpus,
    weights_bytes,
)
from trtspec.triton.repo import instances_on_this_machine

from .conftest import REPO

GIB = 1 << 30


@pytest.mark.parametrize(
    "cpus, weights, instances, expected",
    [
        (2, 25 << 20, 1, 1),  # the embedded models: one thread, whatever the machine
        (64, 25 << 20, 1, 1),
        (2, 16 * GIB, 1, 2),  # an 8B bf16 model: every CPU the process may use
        (32, 16 * GIB, 1, 16),  # ... but no more than one per GiB of weights
        (32, 16 * GIB, 4, 8),  # four served instances share the CPUs
        (3, 16 * GIB, 4, 1),  # more instances than CPUs: still one each
        (3, 16 * GIB, 2, 1),  # whole CPUs each: 3 // 2
        (8, int(1.9 * GIB), 1, 1),
    ],
)
def test_auto_threads(cpus, weights, instances, expected):
    assert choose_threads("auto", cpus, weights, instances).threads == expected


def test_explicit_setting_and_omp_num_threads_win():
    assert choose_threads(6, cpus=2, weights=0).threads == 6  # runtime.threads: N is taken as given
    chosen = choose_threads("auto", cpus=32, weights=16 * GIB, env_threads="3")
    assert chosen.threads == 3 and "OMP_NUM_THREADS=3" in chosen.reason
    assert choose_threads(2, cpus=32, weights=0, env_threads="3").threads == 2
    assert choose_threads("auto", cpus=32, weights=16 * GIB, env_threads="x").threads == 16
    for env in ("1", "0"):  # one thread as asked; none is at least one
        assert choose_threads("auto", cpus=32, weights=16 * GIB, env_threads=env).threads == 1


def test_cgroup_quota(tmp_path):
    v2 = tmp_path / "cpu.max"
    v2.write_text("150000 100000\n")
    assert cgroup_cpu_limit(v2, tmp_path / "no", tmp_path / "no") == 1.5
    v2.write_text("max 100000\n")
    assert cgroup_cpu_limit(v2, tmp_path / "no", tmp_path / "no") is None
    quota, period = tmp_path / "q", tmp_path / "p"
    quota.write_text("-1\n")
    period.write_text("100000\n")
    assert cgroup_cpu_limit(tmp_path / "none", quota, period) is None
    quota.write_text("400000\n")
    assert cgroup_cpu_limit(tmp_path / "none", quota, period) == 4.0
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


def test_weights_are_the_weight_files_directly_in_each_folder(tmp_path):
    """Files ending as weights do (.safetensors, .bin, .pt, .pth) in each folder, not what sits
    beside them (a config, a folder named like a shard, a file in a subfolder); none where no folder."""
    folder = tmp_path / "ckpt"
    (folder / "shard.bin" / "deeper").mkdir(parents=True)
    (folder / "shard.bin" / "deeper" / "x.pt").write_bytes(b"0" * 7)
    for name, size in (("model.safetensors", 300), ("extra.pth", 20), ("config.json", 50)):
        (folder / name).write_bytes(b"0" * size)
    assert weights_bytes([folder, tmp_path / "missing"]) == 320
    assert weights_bytes([]) == 0 and weights_bytes([tmp_path / "missing"]) == 0


def test_weights_of_the_shipped_configs_ask_for_one_thread():
    config = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    size = weights_bytes([config.target.resolved_path, config.drafter.resolved_path])
    assert 10 << 20 < size < BYTES_PER_THREAD
    assert choose_threads(config.runtime.threads, 64, size).threads == 1


def test_runtime_threads_field(tmp_path):
    base = (REPO / "build_configs" / "tiny-dflash.yaml").read_text()
    for value, ok in (("auto", True), ("4", True), ("0", False), ("many", False), ("true", False)):
        path = tmp_path / "c.yaml"
        path.write_text(base + f"runtime: {{threads: {value}}}\n")
        if ok:
            assert str(load_build_config(path).runtime.threads) == value
        else:
            with pytest.raises(ValueError, match=r"field `runtime.threads`: .*expected 'auto' or an integer"):
                load_build_config(path)


def test_instances_counted_as_triton_starts_them():
    assert instances_on_this_machine({"instance_group": [{"count": 1, "kind": "KIND_CPU"}]}) == 1
    assert instances_on_this_machine({"instance_group": [{"count": 2, "gpus": [0, 1, 3]}]}) == 6
    assert instances_on_this_machine({}) == 1


APPLIED = """
import json, sys, torch
from click.testing import CliRunner
from trtspec.cli import main
result = CliRunner().invoke(main, ["generate", "--config", sys.argv[1], "--prompt", "x", "--max-tokens", "2",
                                   "--drafter", sys.argv[2]])
print(json.dumps({"code": result.exit_code, "threads": torch.get_num_threads()}))
"""


@pytest.mark.parametrize("setting, env, expected, drafter",
                         [("auto", None, 1, "config"), ("3", None, 3, "none"), ("auto", "2", 2, "none")])
def test_cli_applies_the_setting(tmp_path, setting, env, expected, drafter):
    """torch starts with one thread per core; `generate` leaves it at the policy's choice. With the
    drafter once (its adaptive schedule measures the cost model first: the ~10 s of each case with
    it, at each thread count)."""
    path = tmp_path / "c.yaml"
    path.write_text((REPO / "build_configs" / "tiny-draft-model.yaml").read_text()
                    + f"runtime: {{threads: {setting}}}\n")
    environ = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if env is not None:
        environ["OMP_NUM_THREADS"] = env
    out = subprocess.run([sys.executable, "-c", APPLIED, str(path), drafter], capture_output=True, text=True,
                         env=environ, timeout=300, check=True).stdout
    assert json.loads(out.splitlines()[-1]) == {"code": 0, "threads": expected}
