"""TensorRT-LLM flavour: generated files against golden copies, names against the kept list,
Triton protobuf round trip, launchers, Kubernetes manifests and drafter conversion.

Regenerate the golden files after an intended change with
    TRTSPEC_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_trtllm.py
and review the diff under tests/golden/ before committing it.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from google.protobuf import text_format
from safetensors.torch import load_file, save_file
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.errors import CheckpointError, ConfigError
from trtspec.plan.models import get_target
from trtspec.trtllm import fields
from trtspec.trtllm.args import llm_args
from trtspec.trtllm.build import build_trtllm
from trtspec.trtllm.convert import check_fits, convert_drafter
from trtspec.trtllm.k8s import manifests

from .conftest import REPO, assert_matches_golden

GOLDEN = REPO / "tests" / "golden" / "trtllm"
TRTLLM_CONFIGS = [
    "llama3.1-8b-dflash.yaml",
    "gpt-oss-120b-dflash-b300-tp8.yaml",
    "deepseek-v4-flash-dspark.yaml",
    "qwen3-8b-eagle3.yaml",
]
ALL_REAL = TRTLLM_CONFIGS + ["qwen3-8b-dflash-h200.yaml"]


def _load(name: str):
    return load_build_config(REPO / "build_configs" / name)


@pytest.mark.parametrize("name", TRTLLM_CONFIGS)
def test_build_matches_golden(tmp_path, name):
    out = tmp_path / "out"
    written = build_trtllm(_load(name), out)
    produced = {p.relative_to(out).as_posix(): p.read_text() for p in written if p.is_file()}
    assert_matches_golden(produced, GOLDEN / Path(name).stem)


@pytest.mark.parametrize("name", ALL_REAL)
def test_generated_names_are_kept_names(name):
    args = llm_args(_load(name), for_triton=True)
    assert set(args) <= fields.LLM_ARGS_FIELDS
    assert set(args["kv_cache_config"]) <= fields.KV_CACHE_FIELDS
    assert set(args["cuda_graph_config"]) <= fields.CUDA_GRAPH_FIELDS
    spec = args["speculative_config"]
    assert set(spec) <= fields.SPEC_FIELDS[spec["decoding_type"]]
    assert spec["speculative_model"].startswith("/models/")


def test_cuda_graphs_cover_the_deployments_batches_or_are_off():
    """cuda_graph_config: padded decode graphs up to deployment.max_batch_size (TensorRT-LLM's own
    default stops at 128, unpadded); target.cuda_graphs false writes null, which turns them off."""
    config = _load("gpt-oss-120b-dflash-b300-tp8.yaml")
    args = llm_args(config, for_triton=False)
    batches = config.deployment.max_batch_size
    assert args["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": batches}
    off = config.model_copy(update={"target": config.target.model_copy(update={"cuda_graphs": False})})
    assert llm_args(off, for_triton=False)["cuda_graph_config"] is None
    with pytest.raises(ConfigError, match=r"cuda_graph_config: \['padding'\] not in the TensorRT-LLM"):
        fields.check_llm_args({"cuda_graph_config": {"padding": True}}, "x")


def test_a_name_outside_the_kept_list_is_refused():
    args = {"tensor_parallel_size": 1, "kv_cache_config": {"free_gpu_mem_fraction": 0.9}}
    with pytest.raises(
        ConfigError, match=r"kv_cache_config: \['free_gpu_mem_fraction'\] not in the TensorRT-LLM"
    ):
        fields.check_llm_args(args, "x")
    with pytest.raises(ConfigError, match=r"decoding_type 'DFLASH' is not one of"):
        fields.check_llm_args({"speculative_config": {"decoding_type": "DFLASH"}}, "x")
    with pytest.raises(ConfigError, match=r"\['speculative_model_path'\]"):
        fields.check_llm_args(
            {"speculative_config": {"decoding_type": "DFlash", "speculative_model_path": "p"}}, "x"
        )


def test_decoding_types_cover_every_method():
    from trtspec.config import Method

    assert set(fields.DECODING_TYPE) == set(Method.__args__)
    assert set(fields.DECODING_TYPE.values()) | {fields.NGRAM_TYPE} == set(fields.SPEC_FIELDS)  # + lookup


def test_pbtxt_parses_as_model_config_without_yaml_owned_fields(tmp_path):
    build_trtllm(_load("llama3.1-8b-dflash.yaml"), tmp_path)
    parsed = text_format.Parse(
        (tmp_path / "triton/llama31-8b-dflash/config.pbtxt").read_text(), mc.ModelConfig()
    )
    assert (parsed.name, parsed.backend) == ("llama31-8b-dflash", "python")
    # max_batch_size and decoupled belong to model.yaml (auto_complete_config sets them).
    assert parsed.max_batch_size == 0 and not parsed.HasField("model_transaction_policy")
    assert [i.name for i in parsed.input][0] == "text_input" and not parsed.input[0].optional
    assert {"acceptance_rate", "total_accepted_draft_tokens"} <= {o.name for o in parsed.output}
    model_yaml = yaml.safe_load((tmp_path / "triton/llama31-8b-dflash/1/model.yaml").read_text())
    assert model_yaml["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert model_yaml["model"] == "/models/Llama-3.1-8B-Instruct" and model_yaml["backend"] == "pytorch"
    serve = yaml.safe_load((tmp_path / "trtllm-serve.yaml").read_text())
    assert serve == {k: v for k, v in model_yaml.items() if k not in ("model", "backend", "triton_config")}


# TensorRT-LLM's own triton_backend/all_models/llmapi/tensorrt_llm/config.pbtxt
# @ 0a71057313ec0626527e164a8fc0205c5822e2f5, written out here as read (name: TYPE, dims; inputs
# other than text_input are optional). Its helpers.py reads the sampling_param_* / return_* / lora_*
# inputs and its model.py (@ 044a90d) sends the kv_cache_* / *_time_ns / acceptance outputs when
# sampling_param_return_perf_metrics is set.
UPSTREAM_LLMAPI_INPUTS = {
    "text_input": ("TYPE_STRING", [-1]), "image_url": ("TYPE_STRING", [-1]), "streaming": ("TYPE_BOOL", [1]),
    "sampling_param_best_of": ("TYPE_INT32", [1]), "sampling_param_temperature": ("TYPE_FP32", [1]),
    "sampling_param_top_k": ("TYPE_INT32", [1]), "sampling_param_top_p": ("TYPE_FP32", [1]),
    "sampling_param_frequency_penalty": ("TYPE_FP32", [1]),
    "sampling_param_presence_penalty": ("TYPE_FP32", [1]),
    "sampling_param_max_tokens": ("TYPE_INT32", [1]), "sampling_param_stop": ("TYPE_STRING", [-1]),
    "sampling_param_seed": ("TYPE_UINT64", [1]),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1]),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", [1]), "return_finish_reason": ("TYPE_BOOL", [1]),
    "return_stop_reason": ("TYPE_BOOL", [1]), "return_cumulative_logprob": ("TYPE_BOOL", [1]),
    "stop": ("TYPE_BOOL", [1]), "lora_id": ("TYPE_UINT64", [1]), "lora_name": ("TYPE_STRING", [1]),
    "lora_path": ("TYPE_STRING", [1]), "lora_ckpt_source": ("TYPE_STRING", [1]),
}
UPSTREAM_LLMAPI_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]), "finish_reason": ("TYPE_STRING", [-1]),
    "stop_reason": ("TYPE_STRING", [-1]), "cumulative_logprob": ("TYPE_FP32", [-1]),
    "kv_cache_reused_block": ("TYPE_INT32", [-1]), "kv_cache_missed_block": ("TYPE_INT32", [-1]),
    "kv_cache_alloc_new_blocks": ("TYPE_INT32", [-1]), "kv_cache_alloc_total_blocks": ("TYPE_INT32", [-1]),
    "kv_cache_hit_rate": ("TYPE_FP32", [-1]), "arrival_time_ns": ("TYPE_INT64", [1]),
    "first_scheduled_time_ns": ("TYPE_INT64", [1]), "first_token_time_ns": ("TYPE_INT64", [1]),
    "last_token_time_ns": ("TYPE_INT64", [1]), "acceptance_rate": ("TYPE_FP32", [1]),
    "total_accepted_draft_tokens": ("TYPE_INT32", [1]), "total_draft_tokens": ("TYPE_INT32", [1]),
}


def test_llmapi_pbtxt_declares_every_tensor_of_tensorrt_llms_own(tmp_path):
    """A client of TensorRT-LLM's llmapi model sending return_cumulative_logprob, best_of or a LoRA
    adapter got "unexpected inference input" from ours (Triton refuses undeclared inputs), and
    the perf-metric outputs its model.py sends were dropped (Triton drops undeclared outputs)."""
    build_trtllm(_load("qwen3-8b-eagle3.yaml"), tmp_path)
    parsed = text_format.Parse(
        (tmp_path / "triton/qwen3-8b-eagle3/config.pbtxt").read_text(), mc.ModelConfig()
    )
    inputs = {i.name: (mc.DataType.Name(i.data_type), list(i.dims)) for i in parsed.input}
    outputs = {o.name: (mc.DataType.Name(o.data_type), list(o.dims)) for o in parsed.output}
    assert inputs == UPSTREAM_LLMAPI_INPUTS
    assert outputs == UPSTREAM_LLMAPI_OUTPUTS
    assert [i.name for i in parsed.input if not i.optional] == ["text_input"]


def test_dspark_draft_length_must_equal_block_size(tmp_path):
    raw = yaml.safe_load((REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml").read_text())
    raw["drafter"]["num_draft_tokens"] = 7
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"num_draft_tokens 7 must equal .* DSpark block size 5"):
        llm_args(load_build_config(path), for_triton=False)


def test_drafter_settings_tensorrt_llm_has_no_field_for_are_refused_not_dropped(tmp_path):
    """Found fuzzing build configs (2026-12-05): drafter.tree and a DSpark threshold schedule built
    a deployment without them, no word said; mode full got the planner's draft_len_schedule. The
    served model's queue bound (limits.max_queued) is refused too."""
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    path = tmp_path / "c.yaml"
    for drafter, message in (
        ({"tree": {"nodes": 8}}, "drafter.tree: flavour trtllm writes draft chains only"),
        ({"schedule": {"mode": "threshold"}}, "drafter.schedule.mode threshold: flavour trtllm verifies"),
    ):
        path.write_text(yaml.safe_dump({**raw, "drafter": {**raw["drafter"], **drafter}}))
        with pytest.raises(ConfigError, match=message):
            load_build_config(path)
    path.write_text(yaml.safe_dump({**raw, "limits": {**raw["limits"], "max_queued": 16}}))
    with pytest.raises(ConfigError, match="limits.max_queued 16: .* trtspec writes no such bound"):
        load_build_config(path)
    path.write_text(yaml.safe_dump({**raw, "drafter": {**raw["drafter"], "schedule": {"mode": "full"}}}))
    spec = llm_args(load_build_config(path), for_triton=False)["speculative_config"]
    assert "max_draft_len" in spec and "draft_len_schedule" not in spec
    assert "acceptance_rate_threshold" not in spec  # every draft, always
    adaptive = llm_args(load_build_config(REPO / "build_configs" / "llama3.1-8b-dflash.yaml"),
                        for_triton=False)
    assert "draft_len_schedule" in adaptive["speculative_config"]


def test_limits_beyond_max_seq_len_are_refused(tmp_path):
    """limits.max_tokens 8192 beside deployment.max_seq_len 8192 was written as is: no request could
    ask for its limit and bring a prompt."""
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    raw["limits"]["max_tokens"] = raw["deployment"]["max_seq_len"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"limits.max_tokens 8192 leaves no room in deployment.max_seq_len "
                                          r"of 8192 positions .* expected \[1, 8191\]"):
        llm_args(load_build_config(path), for_triton=False)


def test_kubernetes_single_node_is_a_deployment_multi_node_a_leader_worker_set():
    single = manifests(_load("gpt-oss-120b-dflash-b300-tp8.yaml"), "x")
    assert [o["kind"] for o in single] == ["ConfigMap", "Deployment", "Service"]
    gpus = single[1]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == 8
    multi = manifests(_load("deepseek-v4-flash-dspark.yaml"), "x")
    assert [o["kind"] for o in multi] == ["ConfigMap", "LeaderWorkerSet", "Service"]
    lws = multi[1]["spec"]["leaderWorkerTemplate"]
    assert lws["size"] == 2
    leader_cmd = lws["leaderTemplate"]["spec"]["containers"][0]["command"][-1]
    assert (
        "mpirun --allow-run-as-root -np 16" in leader_cmd
        and "trtllm-llmapi-launch trtllm-serve" in leader_cmd
    )
    assert multi[2]["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"


def test_multi_node_workers_make_host_keys_and_the_leader_needs_no_known_hosts():
    """Workers ran a bare `sshd -D`, which exits when the image ships no host keys (NVIDIA's
    TensorRT-LLM release image is not built to run sshd), and the leader's mpirun ssh'd with strict
    host key checking against a read-only /root/.ssh: keys made per pod can be in no known_hosts."""
    lws = manifests(_load("deepseek-v4-flash-dspark.yaml"), "x")[1]["spec"]["leaderWorkerTemplate"]
    worker = lws["workerTemplate"]["spec"]["containers"][0]["command"][-1]
    assert worker.index("ssh-keygen -A") < worker.index("sshd -D")
    env = {e["name"]: e["value"] for e in lws["leaderTemplate"]["spec"]["containers"][0]["env"]}
    ssh_args = env["OMPI_MCA_plm_rsh_args"].split()
    assert "StrictHostKeyChecking=no" in ssh_args and "UserKnownHostsFile=/dev/null" in ssh_args


def test_build_cli_writes_trtllm(tmp_path):
    out = tmp_path / "out"
    config = REPO / "build_configs/llama3.1-8b-dflash.yaml"
    ok = CliRunner().invoke(main, ["build", str(config), "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert (out / "deploy/launch.sh").stat().st_mode & 0o111
    # run where TensorRT-LLM is not: the launcher names what is missing (bash: `exec: ...: not found`)
    for mode, missing in (("serve", "trtllm-serve"), ("triton", "tritonserver")):
        ran = subprocess.run(["bash", str(out / "deploy/launch.sh"), mode], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
        assert ran.returncode == 127, ran
        assert ran.stderr.startswith(f"{missing} is not on PATH: run launch.sh in"), ran


# -- drafter conversion ----------------------------------------------------------------------


def _drafter(path: Path, config: dict, names: list[str]) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)
    save_file({n: torch.randn(4, 4, generator=gen) for n in names}, str(path / "model.safetensors"))
    return path


_BACKBONE = ["fc.weight", "hidden_norm.weight", "layers.0.self_attn.q_proj.weight", "norm.weight"]


def test_convert_trtspec_dflash_to_trtllm_layout(tmp_path):
    # trtspec-style: block_size inside dflash_config, a `model.` prefix and a stray embedding.
    config = {
        "model_type": "qwen3",
        "architectures": ["DFlashDraftModel"],
        "vocab_size": 300,
        "dflash_config": {"mask_token_id": 299, "target_layer_ids": [1, 3], "block_size": 8},
    }
    src = _drafter(tmp_path / "src", config, ["model." + n for n in _BACKBONE] + ["embed_tokens.weight"])
    report = convert_drafter(src, tmp_path / "dst", "dflash", dtype="bfloat16")
    out = json.loads((tmp_path / "dst/config.json").read_text())
    assert out["block_size"] == 8 and out["dflash_config"]["mask_token_id"] == 299
    assert out["torch_dtype"] == "bfloat16"
    tensors = load_file(str(tmp_path / "dst/model.safetensors"))
    assert sorted(tensors) == sorted(_BACKBONE)
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    original = load_file(str(src / "model.safetensors"))
    assert torch.equal(tensors["fc.weight"], original["model.fc.weight"].to(torch.bfloat16))
    assert any("dropped embed_tokens.weight" in c for c in report["changes"])


@pytest.mark.parametrize(
    "drop,message",
    [
        ("model_type", "no model_type"),
        ("mask_token_id", "mask_token_id missing; TensorRT-LLM would use vocab_size"),
    ],
)
def test_convert_dflash_refuses_what_trtllm_would_misread(tmp_path, drop, message):
    config = {
        "model_type": "qwen3",
        "block_size": 16,
        "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]},
    }
    config.pop(drop, None)
    config["dflash_config"].pop(drop, None)
    src = _drafter(tmp_path / "src", config, _BACKBONE)
    with pytest.raises(CheckpointError, match=message):
        convert_drafter(src, tmp_path / "dst", "dflash")


LLAMA = "meta-llama/Llama-3.1-8B-Instruct"  # 32 layers, hidden 4096, 128,256 tokens


@pytest.mark.parametrize("edit, message", [
    ({}, None),
    ({"hidden_size": 256}, "hidden_size is 256 but the deployment's target meta-llama/Llama-3.1-8B-Instruct "
                           "has 4096: a drafter of another model"),
    ({"dflash_config": {"mask_token_id": 128_000, "target_layer_ids": [1, 35]}},
     r"target_layer_ids \[1, 35\] are not layers of the deployment's target .* \(0 to 31\)"),
    ({"dflash_config": {"mask_token_id": 200_000, "target_layer_ids": [1, 9]}},
     r"mask_token_id 200000 is outside the vocabulary of the deployment's target .* \(128256\)"),
], ids=["fits", "hidden", "layers", "mask"])
def test_convert_refuses_a_drafter_of_another_target(tmp_path, edit, message):
    """The deployment's target (deployment.model_id) is known at build time though its weights are
    not here: a drafter that does not fit it is refused by the build, not by TensorRT-LLM on the
    GPU nodes (the embedded 256-wide DFlash converted for Llama-3.1-8B used to pass)."""
    config = {"model_type": "llama", "block_size": 10, "hidden_size": 4096,
              "dflash_config": {"mask_token_id": 128_000, "target_layer_ids": [1, 9, 17, 25, 29]}, **edit}
    src = _drafter(tmp_path / "src", config, _BACKBONE)
    convert = functools.partial(convert_drafter, src, tmp_path / "dst", "dflash", target=get_target(LLAMA))
    if message is None:
        assert convert()["method"] == "dflash"
    else:
        with pytest.raises(CheckpointError, match=message):
            convert()


def test_build_refuses_a_drafter_of_another_target(tmp_path):
    """`trtspec build` of the Llama-3.1-8B DFlash deployment with the embedded drafter in the
    drafter's place: one Error: line, nothing written."""
    drafter = tmp_path / "weights" / "LLaMA3.1-8B-Instruct-DFlash-UltraChat"
    shutil.copytree(REPO / "trtspec" / "assets" / "tiny-dflash-b16", drafter)
    config = tmp_path / "llama.yaml"
    config.write_text((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    result = CliRunner().invoke(main, ["build", str(config), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and result.output.count("Error: ") == 1, result.output
    assert "config.json: hidden_size is 256 but the deployment's target" in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spelling", ["nested", "top_level", "plain"])
def test_convert_dspark_normalises_every_spelling(tmp_path, spelling):
    values = {
        "target_layer_ids": [2, 4, 6],
        "mask_token_id": 7,
        "block_size": 7,
        "markov_rank": 256,
        "markov_head_type": "vanilla",
    }
    config = {"model_type": "qwen3"}
    if spelling == "nested":
        config["dspark_config"] = values
    elif spelling == "top_level":
        config.update({fields.DSPARK_DRAFT_KEYS[k]: v for k, v in values.items()})
    else:
        config.update(values)
    src = _drafter(tmp_path / "src", config, _BACKBONE + ["markov_head.markov_w1.weight"])
    convert_drafter(src, tmp_path / "dst", "dspark", max_draft_len=7)
    out = json.loads((tmp_path / "dst/config.json").read_text())
    assert {k: out[fields.DSPARK_DRAFT_KEYS[k]] for k in values} == values
    assert out["dflash_config"] == {"mask_token_id": 7, "target_layer_ids": [2, 4, 6]}
    assert {k: out[k] for k in values} == values  # plain names: modeling_dspark_qwen3 reads only these
    assert "dspark_config" not in out
    assert "markov_head.markov_w1.weight" in load_file(str(tmp_path / "dst/model.safetensors"))


@pytest.mark.parametrize("head_type, tensors", [("gated", ["gate_proj.weight", "gate_proj.bias"]),
                                                 ("rnn", ["joint_proj.weight", "joint_proj.bias"])])
def test_convert_dspark_gated_and_rnn_heads_name_their_type_for_every_reader(tmp_path, head_type, tensors):
    """DeepSpec's gated / RNN heads: the type under dspark_markov_head_type (llm_args, DeepSeek-V4),
    plain markov_head_type (modeling_dspark_qwen3) and dflash_config.markov_head_type (the
    DFlash-path reader, which refuses non-vanilla heads instead of building a vanilla one); the
    head's tensors copied; without them, or with an unknown type, the conversion is refused."""
    config = {"model_type": "qwen3", "target_layer_ids": [1], "mask_token_id": 3, "block_size": 7,
              "markov_rank": 4, "markov_head_type": head_type}
    head = ["markov_head.markov_w1.weight", "markov_head.markov_w2.weight"]
    src = _drafter(tmp_path / "src", config, _BACKBONE + head + [f"markov_head.{t}" for t in tensors])
    convert_drafter(src, tmp_path / "dst", "dspark", max_draft_len=7)
    out = json.loads((tmp_path / "dst/config.json").read_text())
    assert out["dspark_markov_head_type"] == out["markov_head_type"] == head_type
    assert out["dflash_config"]["markov_head_type"] == head_type
    assert {f"markov_head.{t}" for t in tensors} <= set(load_file(str(tmp_path / "dst/model.safetensors")))
    src = _drafter(tmp_path / "bare", config, _BACKBONE + head)
    missing = f"'{head_type}' but the weights have no markov_head.{tensors[0]}"
    with pytest.raises(CheckpointError, match=missing):
        convert_drafter(src, tmp_path / "bare-out", "dspark")
    assert not (tmp_path / "bare-out").exists()
    src = _drafter(tmp_path / "fir", {**config, "markov_head_type": "fir"}, _BACKBONE + head)
    with pytest.raises(CheckpointError, match="markov_head_type is 'fir'; DeepSpec and TensorRT-LLM know"):
        convert_drafter(src, tmp_path / "fir-out", "dspark")


def test_convert_dspark_refuses_disabled_markov_head_and_length_mismatch(tmp_path):
    base = {
        "model_type": "qwen3",
        "dspark_target_layer_ids": [1],
        "dspark_noise_token_id": 3,
        "dspark_block_size": 7,
    }
    src = _drafter(tmp_path / "a", {**base, "dspark_markov_rank": 0}, _BACKBONE)
    with pytest.raises(CheckpointError, match="markov_rank is 0"):
        convert_drafter(src, tmp_path / "a-out", "dspark")
    src = _drafter(tmp_path / "b", {**base, "dspark_markov_rank": 64}, _BACKBONE)
    with pytest.raises(CheckpointError, match="block_size 7 != max_draft_len 5"):
        convert_drafter(src, tmp_path / "b-out", "dspark", max_draft_len=5)
    # two spellings, two block sizes: servers reading different spellings would disagree
    src = _drafter(tmp_path / "c", {**base, "dspark_markov_rank": 64, "block_size": 5}, _BACKBONE)
    with pytest.raises(CheckpointError, match="dspark_block_size = 7 and block_size = 5"):
        convert_drafter(src, tmp_path / "c-out", "dspark")
    assert not (tmp_path / "c-out").exists()


@pytest.mark.parametrize("method, field, value, message", [
    ("dspark", "dspark_markov_rank", 2.5, "dspark_markov_rank must be an integer, got 2.5"),
    ("dspark", "dspark_noise_token_id", "3", "dspark_noise_token_id must be an integer, got '3'"),
    ("dspark", "dspark_target_layer_ids", "135", "dspark_target_layer_ids must be a list of layer indices"),
    ("dspark", "enable_confidence_head", "false", "enable_confidence_head must be true or false"),
    ("dspark", "num_target_layers", True, "num_target_layers must be an integer, got True"),
    ("dspark", "dspark_markov_head_type", 5, "dspark_markov_head_type must be a head type's name, got 5"),
    ("dflash", "mask_token_id", 5.0, "dflash_config.mask_token_id must be an integer, got 5.0"),
    ("dflash", "target_layer_ids", [1, "3"], "dflash_config.target_layer_ids must be a list of"),
])
def test_convert_refuses_a_drafter_field_of_another_type_naming_it(tmp_path, method, field, value, message):
    """The conversion copied them into TensorRT-LLM's config.json as they were ("false" a true
    confidence head, 2.5 a Markov rank, "135" three layers), to fail or misread on the GPU nodes; the
    torch flavour refused them. Refused now as config.json spells them, nothing written."""
    if method == "dspark":
        config = {"model_type": "qwen3", "dspark_target_layer_ids": [1], "dspark_noise_token_id": 3,
                  "dspark_block_size": 7, "dspark_markov_rank": 64, field: value}
    else:
        config = {"model_type": "qwen3", "block_size": 16,
                  "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1], field: value}}
    src = _drafter(tmp_path / "src", config, _BACKBONE + ["markov_head.markov_w1.weight"])
    with pytest.raises(CheckpointError, match=re.escape(message)):
        convert_drafter(src, tmp_path / "dst", method)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(("limits", "deployment", "chunked", "max_num_tokens"), [
    ({}, {}, True, 8192),  # limits.prefill_chunk 512 turns chunking on; TensorRT-LLM keeps its budget
    ({"prefill_chunk": 64}, {}, True, 8192),
    ({"prefill_chunk": 0}, {}, False, 8192),  # whole prompts: TensorRT-LLM's default, not written
    ({}, {"max_num_tokens": 4096}, True, 4096),  # the step's budget is deployment.max_num_tokens
])
def test_chunked_prefill_reaches_tensorrt_llm(tmp_path, limits, deployment, chunked, max_num_tokens):
    """limits.prefill_chunk was not written at all: TensorRT-LLM ran with chunked prefill off (its
    default), a full step's budget of 8192 tokens, and refused prompts longer than that."""
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    raw["limits"].update(limits)
    raw["deployment"].update(deployment)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    args = llm_args(load_build_config(path), for_triton=False)
    assert args.get("enable_chunked_prefill", False) is chunked
    assert ("enable_chunked_prefill" in args) is chunked
    assert args["max_num_tokens"] == max_num_tokens
    assert set(args) <= fields.LLM_ARGS_FIELDS


def test_a_serve_parser_that_is_no_name_is_refused_by_its_field(tmp_path):
    """deployment.reasoning_parser / tool_parser go to trtllm-serve as flags (the golden qwen3-8b-eagle3
    launch.sh and k8s.yaml hold them); a value that is no parser's name is refused naming its field."""
    text = (REPO / "build_configs/qwen3-8b-eagle3.yaml").read_text()
    for field in ("reasoning_parser", "tool_parser"):
        bad = tmp_path / f"{field}.yaml"
        bad.write_text(text.replace(f"{field}: qwen3", f"{field}: qwen3 --trust_remote_code"))
        with pytest.raises(ConfigError, match=rf"deployment\.{field}"):
            load_build_config(bad)


def test_prompt_lookup_alone_is_tensorrt_llms_ngram_drafter(tmp_path):
    """`lookup:` without a drafter: speculative_config is NGramDecodingConfig's (a private pool, or
    the public one with lookup.pool_tokens; the newest match, runs up to max_match), a whole build
    writes it, and what TensorRT-LLM cannot run (lookup beside a DFlash drafter, a min_match it has
    no field for) is refused by name at load."""
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    raw.pop("drafter")
    raw["deployment"].pop("drafter_id", None)
    raw["lookup"] = {"num_draft_tokens": 6, "max_match": 3}
    path = tmp_path / "ngram.yaml"
    path.write_text(yaml.safe_dump(raw))
    config = load_build_config(path)
    spec = llm_args(config, for_triton=False)["speculative_config"]
    assert spec == {"decoding_type": "NGram", "max_draft_len": 6, "max_matching_ngram_size": 3,
                    "is_keep_all": True, "is_use_oldest": False, "is_public_pool": False}
    written = build_trtllm(config, tmp_path / "out")
    serve = yaml.safe_load((tmp_path / "out" / "trtllm-serve.yaml").read_text())
    assert serve["speculative_config"] == spec and any(p.name == "launch.sh" for p in written)
    path.write_text(yaml.safe_dump({**raw, "lookup": {**raw["lookup"], "pool_tokens": 4096}}))
    pooled = llm_args(load_build_config(path), for_triton=False)["speculative_config"]
    assert pooled == {**spec, "is_public_pool": True}  # one pool for all requests (lookup.pool_tokens)
    for lookup, message in (({"min_match": 2}, "lookup.min_match 2: TensorRT-LLM's NGram drafter"),):
        path.write_text(yaml.safe_dump({**raw, "lookup": lookup}))
        with pytest.raises(ConfigError, match=message):
            load_build_config(path)
    both = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    path.write_text(yaml.safe_dump({**both, "lookup": {}}))
    with pytest.raises(ConfigError, match="lookup beside a dflash drafter needs flavour torch or engine: "
                                          "TensorRT-LLM copies beside a drafter only for EAGLE-3"):
        load_build_config(path)


def test_prompt_lookup_beside_eagle3_is_tensorrt_llms_suffix_automaton_enhancer(tmp_path):
    """`lookup:` beside an EAGLE-3 drafter: Eagle3DecodingConfig.sa_config (SAEnhancerConfig), its
    threshold lookup.min_match and its global pool lookup.pool_tokens > 0, in a whole build; a copy
    length other than the drafter's is refused by name."""
    raw = yaml.safe_load((REPO / "build_configs" / "qwen3-8b-eagle3.yaml").read_text())
    path = tmp_path / "eagle3-lookup.yaml"
    cases = (({"num_draft_tokens": 7, "min_match": 3}, {"threshold": 3, "enable_global_pool": False}),
             ({"num_draft_tokens": 7, "pool_tokens": 4096}, {"threshold": 1, "enable_global_pool": True}))
    for lookup, sa in cases:
        path.write_text(yaml.safe_dump({**raw, "lookup": lookup}))
        config = load_build_config(path)
        spec = llm_args(config, for_triton=False)["speculative_config"]
        plain = llm_args(load_build_config(REPO / "build_configs" / "qwen3-8b-eagle3.yaml"),
                         for_triton=False)["speculative_config"]
        assert spec == {**plain, "sa_config": sa}
    build_trtllm(config, tmp_path / "out")
    serve = yaml.safe_load((tmp_path / "out" / "trtllm-serve.yaml").read_text())
    assert serve["speculative_config"]["sa_config"] == sa
    path.write_text(yaml.safe_dump({**raw, "lookup": {"num_draft_tokens": 8}}))
    with pytest.raises(ConfigError, match=r"num_draft_tokens 8 must equal the drafter's max_draft_len 7"):
        llm_args(load_build_config(path), for_triton=False)


def test_the_smallest_shared_pool_turns_tensorrt_llms_public_pool_on(tmp_path):
    """lookup.pool_tokens 1, the least a shared pool can hold, is still a pool shared by all requests:
    NGram's is_public_pool and the suffix automaton's enable_global_pool both follow pool_tokens > 0."""
    def spec_of(name: str, lookup: dict, drop_drafter: bool = False) -> dict:
        raw = yaml.safe_load((REPO / "build_configs" / name).read_text())
        if drop_drafter:
            raw.pop("drafter")
            raw["deployment"].pop("drafter_id", None)
        path = tmp_path / "pool.yaml"
        path.write_text(yaml.safe_dump({**raw, "lookup": {**lookup, "pool_tokens": 1}}))
        return llm_args(load_build_config(path), for_triton=False)["speculative_config"]

    ngram = spec_of("llama3.1-8b-dflash.yaml", {"num_draft_tokens": 6, "max_match": 3}, drop_drafter=True)
    assert ngram["decoding_type"] == "NGram" and ngram["is_public_pool"] is True
    eagle3 = spec_of("qwen3-8b-eagle3.yaml", {"num_draft_tokens": 7})
    assert eagle3["sa_config"] == {"threshold": 1, "enable_global_pool": True}


def test_the_z_lab_qwen3_drafters_taps_are_z_labs_spread_over_qwen3_8b():
    """drafter_id z-lab/Qwen3-8B-DFlash-b16 writes its checkpoint's mask id and target layers, so
    TensorRT-LLM neither falls back to vocab_size nor taps other layers than the drafter was trained on:
    its five taps are z-lab's even spread over Qwen3-8B's layers (models/dflash.py)."""
    from trtspec.models.dflash import build_target_layer_ids
    from trtspec.plan.models import get_drafter

    spec = llm_args(_load("qwen3-8b-dflash-h200.yaml"), for_triton=False)["speculative_config"]
    drafter = get_drafter("z-lab/Qwen3-8B-DFlash-b16")
    taps = build_target_layer_ids(get_target("Qwen/Qwen3-8B").num_layers, drafter.num_layers)
    assert spec["target_layer_ids"] == taps == [1, 9, 17, 25, 33]
    assert spec["mask_token_id"] == 151669  # z-lab's config.json (plan/models.py)


def test_convert_notes_the_weights_it_renames_and_only_those(tmp_path):
    """A drafter's model.fc.weight is renamed fc.weight (TensorRT-LLM's name) and the report says so;
    weights already named as TensorRT-LLM reads them are copied without a note."""
    config = {"model_type": "qwen3", "block_size": 16,
              "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}}
    src = _drafter(tmp_path / "src", config, ["model.fc.weight", "hidden_norm.weight", "norm.weight"])
    report = convert_drafter(src, tmp_path / "dst", "dflash")
    renamed = [c for c in report["changes"] if c.startswith("renamed")]
    assert renamed == ["renamed model.fc.weight -> fc.weight"]
    assert sorted(load_file(str(tmp_path / "dst/model.safetensors"))) == ["fc.weight", "hidden_norm.weight",
                                                                         "norm.weight"]


def test_convert_into_a_new_nested_folder_then_again_into_the_same_one(tmp_path):
    """A build writes the converted drafter under folders it has yet to make, and a second build into
    the same output converts over the first one's files."""
    config = {"model_type": "qwen3", "block_size": 16,
              "dflash_config": {"mask_token_id": 5, "target_layer_ids": [1]}}
    src = _drafter(tmp_path / "src", config, _BACKBONE)
    dst = tmp_path / "out" / "weights" / "drafter"
    first = convert_drafter(src, dst, "dflash")
    assert convert_drafter(src, dst, "dflash", dtype="float16") == {**first, "changes": [
        *first["changes"], "cast floating-point weights to float16"]}
    assert json.loads((dst / "config.json").read_text())["torch_dtype"] == "float16"
    assert all(t.dtype == torch.float16 for t in load_file(str(dst / "model.safetensors")).values())


def test_convert_dspark_keeps_a_rank_one_head_and_the_keys_it_does_not_resolve(tmp_path):
    """markov_rank 1 is a Markov head (only 0 disables it); dspark_config keys trtspec does not resolve
    (shift_label) stay in dspark_config and dflash_config keys besides the mask id and layer ids
    (use_swa) stay in dflash_config, where TensorRT-LLM's readers look for them."""
    config = {"model_type": "qwen3", "dflash_config": {"use_swa": False},
              "dspark_config": {"target_layer_ids": [1, 3], "mask_token_id": 9, "block_size": 7,
                                "markov_rank": 1, "shift_label": False}}
    src = _drafter(tmp_path / "src", config, _BACKBONE + ["markov_head.markov_w1.weight"])
    convert_drafter(src, tmp_path / "dst", "dspark", max_draft_len=7)
    out = json.loads((tmp_path / "dst/config.json").read_text())
    assert out["markov_rank"] == out["dspark_markov_rank"] == 1
    assert out["dspark_config"] == {"shift_label": False}
    assert out["dflash_config"] == {"use_swa": False, "mask_token_id": 9, "target_layer_ids": [1, 3]}


@pytest.mark.parametrize("layers, mask, message", [
    ([0, 31], 0, None),  # the first and last of Llama-3.1-8B's 32 layers, the first token id
    ([0, 31], 128_255, None),  # the last token id
    ([1, 32], 5, r"target_layer_ids \[1, 32\] are not layers"),
    ([1, 9], 128_256, "mask_token_id 128256 is outside the vocabulary"),
], ids=["first", "last", "one-layer-past", "one-id-past"])
def test_check_fits_takes_every_layer_and_token_id_of_the_target_and_none_past(layers, mask, message):
    """A drafter's target_layer_ids and mask_token_id must name a layer and a token of its target:
    the first and last of each fit, one past either is refused by name."""
    config = {"hidden_size": 4096, "dflash_config": {"mask_token_id": mask, "target_layer_ids": layers}}
    check = functools.partial(check_fits, config, get_target(LLAMA), Path("drafter"))
    if message is None:
        check()
    else:
        with pytest.raises(CheckpointError, match=message):
            check()


@pytest.mark.parametrize("ep", [1, 2, 16])
def test_expert_parallelism_is_written_from_two_ways_up(tmp_path, ep):
    """moe_expert_parallel_size 1 (no expert parallelism) is left to TensorRT-LLM, which derives it;
    from 2 up it reaches the LLM-API arguments as configured."""
    raw = yaml.safe_load((REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml").read_text())
    raw["deployment"]["moe_expert_parallel_size"] = ep
    path = tmp_path / "ep.yaml"
    path.write_text(yaml.safe_dump(raw))
    args = llm_args(load_build_config(path), for_triton=False)
    assert args.get("moe_expert_parallel_size") == (None if ep == 1 else ep)


def test_convert_dspark_writes_a_head_type_in_lower_case_for_every_reader(tmp_path):
    """The torch flavour reads markov_head_type case-blind (models/dspark.py: "Vanilla" is the vanilla
    head), TensorRT-LLM's readers compare it with "vanilla" / "gated" / "rnn": the converted config
    spells it in lower case under every name it is written, and a vanilla head is not named in
    dflash_config."""
    config = {"model_type": "qwen3", "target_layer_ids": [1], "mask_token_id": 3, "block_size": 7,
              "markov_rank": 4, "markov_head_type": "Vanilla"}
    src = _drafter(tmp_path / "src", config, _BACKBONE + ["markov_head.markov_w1.weight"])
    convert_drafter(src, tmp_path / "dst", "dspark", max_draft_len=7)
    out = json.loads((tmp_path / "dst/config.json").read_text())
    assert out["markov_head_type"] == out["dspark_markov_head_type"] == "vanilla"
    assert "markov_head_type" not in out["dflash_config"]
