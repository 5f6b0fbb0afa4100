"""Memory planner: figures computed by hand for two real configs, and the refusals users hit."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.errors import ConfigError
from trtspec.plan.deployment import DeploymentConfig
from trtspec.plan.gpus import get_gpu
from trtspec.plan.memory import PlanError, check_fits, format_plan, plan_memory
from trtspec.plan.models import PUBLISHED_PARAMS, PUBLISHED_PARAMS_UNIT, TARGETS, get_drafter

from .conftest import REPO

GIB = 1024**3
REAL_CONFIGS = [
    "qwen3-8b-dflash-h200.yaml",
    "llama3.1-8b-dflash.yaml",
    "qwen3-8b-eagle3.yaml",
    "gpt-oss-120b-dflash-b300-tp8.yaml",
    "deepseek-v4-flash-dspark.yaml",
]


# What the formula leaves out (norms, biases, attention sinks), counted by hand from each config.
LEFT_OUT = {
    # 36 layers x (2 RMSNorms of 4096 + q_norm and k_norm of head_dim 128) + final norm 4096
    "Qwen/Qwen3-8B": 36 * (2 * 4096 + 2 * 128) + 4096,
    # 32 layers x 2 RMSNorms + final norm, all 4096
    "meta-llama/Llama-3.1-8B-Instruct": 65 * 4096,
    # 36 layers x (q/k/v biases 4096 + 512 + 512, o bias 2880, 64 sinks, router bias 128, expert
    # biases 128 x (2 x 2880 + 2880), 2 norms of 2880) + final norm 2880
    "openai/gpt-oss-120b": 36 * (5120 + 2880 + 64 + 128 + 128 * 3 * 2880 + 2 * 2880) + 2880,
}
DERIVED = {  # by hand: layers x (attention + MLP/experts + router) + embeddings (+ untied LM head)
    "Qwen/Qwen3-8B": 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 2 * 151936 * 4096,
    "meta-llama/Llama-3.1-8B-Instruct": 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    + 2 * 128256 * 4096,
    "openai/gpt-oss-120b": 36 * (2 * 2880 * 4096 + 2 * 2880 * 512 + 128 * 3 * 2880 * 2880 + 2880 * 128)
    + 2 * 201088 * 2880,
}


@pytest.mark.parametrize("model_id", list(DERIVED))
def test_derived_parameter_counts_match_published(model_id):
    # DeepSeek-V4-Flash is left out: its attention count is derived FROM the published total.
    total = TARGETS[model_id].total_params()
    assert total == DERIVED[model_id]
    # With what the formula leaves out (< 0.04%) it rounds to the published count at the precision
    # published: 8,190,735,360 (8.19B), 8,030,261,248 (8.03B), 116,829,156,672 (116.83B).
    assert abs(total + LEFT_OUT[model_id] - PUBLISHED_PARAMS[model_id]) <= PUBLISHED_PARAMS_UNIT[model_id] / 2


@pytest.mark.parametrize("name", REAL_CONFIGS)
def test_real_configs_load_and_plan_without_weights(name):
    config = load_build_config(REPO / "build_configs" / name)
    assert not config.target.resolved_path.exists()  # weights are resolved at deploy time
    plan = plan_memory(config.deployment)
    check_fits(plan, config.deployment.min_concurrency, name)
    assert plan.max_batch_at_max_seq_len >= 1


def test_qwen3_8b_dflash_h200_by_hand():
    config = load_build_config(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml")
    plan = plan_memory(config.deployment)
    # Qwen3-8B, bf16, TP 1: per layer q/o 2*4096*4096 + k/v 2*4096*1024 + MLP 3*4096*12288
    # = 192,937,984 params; 36 layers + untied embed/lm_head 2*151936*4096 = 8,190,427,136 params.
    assert plan.weights_per_gpu_bytes == 8_190_427_136 * 2 == 16_380_854_272
    # z-lab drafter: 5 such layers + fc 5*4096*4096 = 1,048,576,000 params, bf16.
    assert plan.drafter_per_gpu_bytes == 2_097_152_000
    # KV per token: target 36 layers * 2 (K,V) * 8 heads * 128 * 2 B = 147,456;
    # DFlash context cache 5 layers * 2 * 8 * 128 * 2 B = 20,480.
    assert plan.kv_per_token_bytes == 167_936
    # H200 143,771 MiB (nvidia-smi) = 150,754,820,096 B - weights - drafter - 5 GiB reserve
    # = 126,908,104,704 B; 90% of it:
    assert plan.gpu_memory_bytes == 143_771 * 2**20 == 150_754_820_096
    assert plan.kv_budget_bytes == 114_217_294_233
    assert plan.max_tokens_in_kv == 680_123  # 114,217,294,233 // 167,936
    assert plan.max_batch_at_max_seq_len == 83  # // (8192 * 167,936)
    assert plan.max_context_at_max_batch == 21_253  # (114,217,294,233 // 32) // 167,936


def test_gpt_oss_120b_b300_tp8_by_hand():
    config = load_build_config(REPO / "build_configs" / "gpt-oss-120b-dflash-b300-tp8.yaml")
    plan = plan_memory(config.deployment)
    # Per layer: attention 2*2880*64*64 + 2*2880*8*64 = 26,542,080 and router 2880*128 = 368,640
    # params in bf16; experts 128*3*2880*2880 = 3,185,049,600 params in MXFP4 (4.25 bits).
    # Over TP 8: (26,910,720*2 + 3,185,049,600*0.53125) / 8 = 218,234,880 B per layer per GPU;
    # 36 layers + embed/lm_head 2*201088*2880*2/8 = 289,566,720 B.
    assert plan.weights_per_gpu_bytes == 36 * 218_234_880 + 289_566_720 == 8_146_022_400
    # Drafter: 5 * (26,542,080 + 3*2880*8640) + fc 5*2880*2880 params, bf16, / 8.
    assert plan.drafter_per_gpu_bytes == 136_857_600
    # KV, 1 KV head per GPU (8 / 8): 18 full-attention layers * 2 * 64 * 2 B = 4,608 + drafter
    # 5 * 2 * 64 * 2 = 1,280 per token; 18 sliding layers * 128 tokens * 256 B = 589,824 per request.
    assert (plan.kv_per_token_bytes, plan.kv_per_sequence_fixed_bytes) == (5_888, 589_824)
    free = 288_000_000_000 - 8_146_022_400 - 136_857_600 - 5 * GIB
    assert plan.kv_budget_bytes == math.floor(0.9 * free) == 246_913_569_792
    assert plan.max_tokens_in_kv == 41_935_049
    assert plan.max_batch_at_max_seq_len == 1_275  # // (32768 * 5,888 + 589,824)
    # max_batch_size 128: (246,913,569,792 // 128 - 589,824) // 5,888 = 1,928,422,440 // 5,888
    assert plan.max_context_at_max_batch == 327_517
    # 1,275 full-length requests fit the budget, 1,276 do not: 1,276 x 193,527,808 B > 246,913,569,792 B.
    check_fits(plan, 1_275, "cfg")
    with pytest.raises(PlanError, match=r"KV cache too small on B300: 1276 request\(s\)"):
        check_fits(plan, 1_276, "cfg")


def _deployment(**overrides) -> DeploymentConfig:
    fields = {"gpu": "H200", "gpus_per_node": 1, "model_id": "Qwen/Qwen3-8B", **overrides}
    return DeploymentConfig(**fields)


def test_refuses_tp_not_dividing_heads():
    with pytest.raises(
        PlanError, match=r"tensor_parallel_size 3 does not divide Qwen/Qwen3-8B's 32 attention heads"
    ):
        plan_memory(_deployment(gpus_per_node=3, tensor_parallel_size=3))


def test_refuses_world_size_not_matching_gpus():
    with pytest.raises(PlanError, match=r"= 2 but nodes x gpus_per_node = 1 x 4 = 4"):
        plan_memory(_deployment(gpus_per_node=4, tensor_parallel_size=2))


def test_refuses_ep_not_dividing_tp():
    dep = _deployment(
        model_id="openai/gpt-oss-120b", gpus_per_node=4, tensor_parallel_size=4, moe_expert_parallel_size=8
    )
    with pytest.raises(PlanError, match=r"moe_expert_parallel_size 8 must divide tensor_parallel_size 4"):
        plan_memory(dep)


@pytest.mark.parametrize("deployment", [
    _deployment(gpus_per_node=2, tensor_parallel_size=2),  # 4 KV heads per GPU
    load_build_config(REPO / "build_configs" / "gpt-oss-120b-dflash-b300-tp8.yaml").deployment,
])
def test_every_byte_and_token_count_is_a_whole_number(deployment):
    # as `inspect --json` prints them: 589824, not 589824.0
    plan = plan_memory(deployment)
    assert all(type(value) is int for key, value in plan.to_dict().items() if key != "gpu")


def test_cost_model_context_defaults_to_a_quarter_of_max_seq_len_and_may_be_all_of_it():
    assert _deployment(max_seq_len=8190).context_len == 2047  # 8190 / 4 = 2047.5 tokens, rounded down
    assert _deployment(mean_context_len=100).context_len == 100
    assert _deployment(mean_context_len=8192).context_len == 8192  # as long as a request may run
    with pytest.raises(ValueError, match="mean_context_len 8193 is longer than max_seq_len 8192"):
        _deployment(mean_context_len=8193)


def test_refuses_a_pipeline_stage_without_a_layer():
    # 36 stages of Qwen3-8B's 36 layers: one layer (192,937,984 params) + the untied embedding or LM
    # head (151,936 x 4096) per stage, bf16; a 37th stage would hold no layer.
    plan = plan_memory(_deployment(nodes=9, gpus_per_node=4, pipeline_parallel_size=36))
    assert plan.weights_per_gpu_bytes == 2 * (192_937_984 + 151_936 * 4096) == 1_630_535_680
    with pytest.raises(PlanError, match=r"pipeline_parallel_size 37 exceeds Qwen/Qwen3-8B's 36 layers"):
        plan_memory(_deployment(nodes=37, pipeline_parallel_size=37))


def test_refuses_expert_parallelism_for_a_dense_model():
    dep = _deployment(gpus_per_node=2, tensor_parallel_size=2, moe_expert_parallel_size=2)
    with pytest.raises(PlanError, match=r"moe_expert_parallel_size 2 but Qwen/Qwen3-8B has no experts"):
        plan_memory(dep)


def test_weights_that_do_not_fit_name_each_part_and_leave_no_cache():
    config = load_build_config(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml")
    plan = plan_memory(config.deployment.model_copy(update={"runtime_reserve_gib": 1024}))
    # weights 16,380,854,272 B = 15.26 GiB + drafter 2,097,152,000 B = 1.95 GiB + reserve 1024 GiB
    # = 1041.21 GiB on a 140.4 GiB H200.
    with pytest.raises(PlanError, match=r"1041\.2 GiB per GPU needed \(weights 15\.3 \+ drafter 2\.0 \+ "
                                        r"reserve 1024\.0\), 140\.4 GiB available: short by 900\.8 GiB"):
        check_fits(plan, 1, "cfg")
    assert (plan.max_tokens_in_kv, plan.max_batch_at_max_seq_len, plan.max_context_at_max_batch) == (0, 0, 0)


def test_a_kv_budget_of_exactly_the_requests_needed_fits():
    config = load_build_config(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml")
    plan = plan_memory(config.deployment)
    # 2 requests of 8192 tokens at 167,936 B per token, no sliding windows: 2,751,463,424 B.
    exact = dataclasses.replace(plan, kv_budget_bytes=2 * 8192 * 167_936, max_context_at_max_batch=8192)
    check_fits(exact, 2, "cfg")
    with pytest.raises(PlanError, match=r"KV cache too small"):
        check_fits(exact, 3, "cfg")
    # KV room for exactly max_seq_len per request is a fit.
    assert "max_batch_size 32 requests of max_seq_len 8,192 tokens: fit (KV room for 8,192 each)" \
        in format_plan(exact, config.deployment)


def test_refuses_weights_that_do_not_fit_saying_by_how_much():
    plan = plan_memory(_deployment(model_id="deepseek-ai/DeepSeek-V4-Flash", kv_cache_dtype="fp8"))
    # One H200 (143,771 MiB) for ~155 GB of FP4/FP8/bf16 weights plus the 5 GiB reserve.
    short = plan.weights_per_gpu_bytes + 5 * GIB - 143_771 * 2**20
    assert short > 0 and plan.kv_budget_bytes == -short
    with pytest.raises(PlanError, match=rf"weights do not fit on H200: .* short by {short / GIB:.1f} GiB"):
        check_fits(plan, 1, "cfg")


def test_refuses_kv_too_small_for_min_concurrency():
    plan = plan_memory(_deployment(max_seq_len=131072))
    need = 100 * 131072 * plan.kv_per_token_bytes
    with pytest.raises(PlanError, match=rf"short by {(need - plan.kv_budget_bytes) / GIB:.2f} GiB"):
        check_fits(plan, 100, "cfg")
    check_fits(plan, 1, "cfg")


def test_unknown_gpu_fails_at_load_naming_the_field(tmp_path):
    raw = yaml.safe_load((REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml").read_text())
    raw["deployment"]["gpu"] = "A100"
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(
        ConfigError, match=r"field `deployment.gpu`: expected one of H100, H200, B200, B300, got 'A100'$"
    ):
        load_build_config(path)


def test_a_mean_context_past_max_seq_len_fails_at_load(tmp_path):
    """inspect planned 0 tokens/s at every batch size for it, exit 0."""
    raw = yaml.safe_load((REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml").read_text())
    raw["deployment"]["mean_context_len"] = 10**9
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"c.yaml: field `deployment`: .*mean_context_len 1000000000 is "
                                          r"longer than max_seq_len 8192"):
        load_build_config(path)


@pytest.mark.parametrize("field, value", [("model_id", "no-such/model"), ("drafter_id", "z-lab/nope")])
def test_an_unknown_architecture_fails_at_load_naming_the_field(tmp_path, field, value):
    """build and inspect refused it only when planning: exit 1, naming neither file nor field."""
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    raw["deployment"][field] = value
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 2, result.output
    assert f"c.yaml: field `deployment.{field}`: expected one of " in result.output
    assert result.output.rstrip().endswith(f", got '{value}'"), result.output



def test_inspect_prints_the_plan():
    result = CliRunner().invoke(main, ["inspect", str(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml")])
    assert result.exit_code == 0, result.output
    assert "680,123 tokens in KV" in result.output and "15.26 GiB per GPU" in result.output
    assert "1 H200 (141 GB data sheet, 140.4 GiB each planned)" in result.output


def _inspect_h200_with(tmp_path, edit):
    """`trtspec inspect` of build_configs/qwen3-8b-dflash-h200.yaml as `edit` changes it (in place)."""
    raw = yaml.safe_load((REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml").read_text())
    edit(raw)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    return result, path


def test_inspect_says_what_build_would_refuse(tmp_path):
    """Found fuzzing (2026-12-05): with deployment.min_concurrency 100 (83 full-length requests fit)
    inspect printed "fit" and build refused; inspect now says why build refuses it."""
    result, path = _inspect_h200_with(tmp_path, lambda raw: raw["deployment"].update(min_concurrency=100))
    assert "build     refuses it: config 'qwen3-8b-dflash': KV cache too small on H200: 100 request(s)" \
        in result.output
    said = CliRunner().invoke(main, ["inspect", str(path), "--json"]).output
    assert "KV cache too small" in json.loads(said)["build_refuses"]
    fine = CliRunner().invoke(main, ["inspect", str(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml"),
                                     "--json"]).output
    assert json.loads(fine)["build_refuses"] is None


def test_inspect_of_weights_that_do_not_fit_plans_no_cache_and_no_speed(tmp_path):
    """Found fuzzing build configs (2026-12-05): runtime_reserve_gib 1024 printed a KV budget of
    -900.81 GiB and predicted 19,295 tokens/s beside "build refuses it"."""
    result, _ = _inspect_h200_with(tmp_path, lambda raw: raw["deployment"].update(runtime_reserve_gib=1024))
    assert "KV budget     none: weights, drafter and reserve exceed the GPU by 900.81 GiB" in result.output
    assert "-900" not in result.output and "predicted tokens/s" not in result.output
    assert "speculation not planned: the weights do not fit" in result.output


def test_inspect_of_mode_full_says_the_schedule_is_not_used(tmp_path):
    """Found fuzzing build configs (2026-12-05): with drafter.schedule.mode full (trtllm writes no
    draft_len_schedule) inspect printed the adaptive plan as if it ran."""
    for mode, said in (("full", "(not used: drafter.schedule.mode full drafts k = 15 always)"),
                       ("adaptive", "(not written (see trtspec/trtllm/fields.py))")):
        def set_mode(raw, mode=mode):
            raw["drafter"]["schedule"] = {"mode": mode}

        result, _ = _inspect_h200_with(tmp_path, set_mode)
        assert said in result.output
        assert ("mode full runs the `always k=15` column" in result.output) == (mode == "full")


def test_build_refuses_a_config_that_cannot_fit(tmp_path):
    raw = yaml.safe_load((REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml").read_text())
    raw["deployment"].update(nodes=1, gpus_per_node=1, tensor_parallel_size=1, moe_expert_parallel_size=1)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["build", str(path), "--out", str(tmp_path / "out")])
    # a build that cannot finish is a run-time failure: one `Error:` line, exit 1, no usage text
    assert result.exit_code == 1 and "Usage:" not in result.output
    assert result.output.startswith("Error: ") and len(result.output.strip().splitlines()) == 1
    assert "weights do not fit on H200" in result.output and "short by" in result.output
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["c.yaml"]


def test_deepseek_v4_fp8_kv_row_keeps_rope_dims_in_bf16():
    # DeepSeek-V4-Flash, FP8 KV, TP 16 (the single KV head is replicated, not split): one K=V row is
    # 448 fp8 dims + 64 RoPE dims in bf16 + 8 B of ue8m0 scales = 584 B (DeepSeek-V4 report 2.3.4;
    # SGLang's DeepSeek-V4 memory pool), not head_dim 512 x 1 B.
    dep = _deployment(model_id="deepseek-ai/DeepSeek-V4-Flash", kv_cache_dtype="fp8", nodes=2,
                      gpus_per_node=8, tensor_parallel_size=16, moe_expert_parallel_size=16)
    plan = plan_memory(dep)
    # Layers 2..42: 21 CSA (ratio 4, + 132 B indexer row) and 20 HCA (ratio 128) layers.
    assert plan.kv_per_token_bytes == math.ceil(21 * (584 + 132) / 4 + 20 * 584 / 128) == 3_851
    # Every one of the 43 layers keeps a 128-token window of rows.
    assert plan.kv_per_sequence_fixed_bytes == 43 * 128 * 584 == 3_214_336
    # bf16 ("auto"): 512 dims x 2 B, the indexer row stays fp8.
    plan = plan_memory(dep.model_copy(update={"kv_cache_dtype": "auto"}))
    assert plan.kv_per_token_bytes == math.ceil(21 * (1024 + 132) / 4 + 20 * 1024 / 128) == 6_229
    assert plan.kv_per_sequence_fixed_bytes == 43 * 128 * 1024


def test_dspark_drafter_window_is_one_shared_kv_row_per_token():
    # The embedded DSpark blocks are DeepSeek-V4 blocks: their 128-token window caches one shared K=V
    # row per token (584 B in fp8), not separate K and V rows (2 x 512 B before).
    config = load_build_config(REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml")
    plan = plan_memory(config.deployment)
    assert plan.kv_per_token_bytes == 3_851  # the drafter adds nothing per context token
    assert plan.kv_per_sequence_fixed_bytes == (43 + 3) * 128 * 584 == 3_438_592


def test_eagle3_drafter_attention_reads_2h_wide_inputs():
    config = load_build_config(REPO / "build_configs" / "qwen3-8b-eagle3.yaml")
    plan = plan_memory(config.deployment)
    # One layer: q/k/v from [embedding; hidden] (2 x 4096 wide) to 32 + 8 + 8 heads of 128, o
    # 4096 x 4096 = 67,108,864; MLP 3 x 4096 x 12288; fc 3 x 4096 x 4096; lm_head 32000 x 4096;
    # bf16. (EAGLE's cnets.py: q_proj = Linear(hidden_size * 2, ...).)
    params = 2 * 4096 * 48 * 128 + 4096 * 4096 + 3 * 4096 * 12288 + 3 * 4096 * 4096 + 32000 * 4096
    assert plan.drafter_per_gpu_bytes == 2 * params == 2 * 399_507_456


def test_llama_dflash_drafter_has_its_published_widths():
    # z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat: 5 layers at hidden 4096, 32 / 8 heads of 128,
    # intermediate 12288, fc over 5 taps; its one bf16 safetensors file is 1.95 GiB (1.05B params).
    config = load_build_config(REPO / "build_configs" / "llama3.1-8b-dflash.yaml")
    plan = plan_memory(config.deployment)
    params = 5 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288) + 5 * 4096 * 4096
    assert params == 1_048_576_000
    assert plan.drafter_per_gpu_bytes == 2 * params
    assert f"{plan.drafter_per_gpu_bytes / GIB:.2f}" == "1.95"


def test_dflash_fc_counts_the_target_layers_tapped_not_the_draft_layers():
    # z-lab/gpt-oss-120b-DFlash: 8 layers (attention 2 x 2880 x 4096 + 2 x 2880 x 512, MLP
    # 3 x 2880 x 7680) and fc over 5 taps (5 x 2880^2): 784,650,240 params, its published 0.78B and
    # 1.46 GiB in bf16.
    drafter = get_drafter("z-lab/gpt-oss-120b-DFlash")
    params = 8 * (2 * 2880 * 4096 + 2 * 2880 * 512 + 3 * 2880 * 7680) + 5 * 2880 * 2880
    assert drafter.total_params() == params == 784_650_240
    assert f"{2 * params / GIB:.2f}" == "1.46"


def test_deepseek_v4_embedding_and_lm_head_are_bf16():
    # DeepSeek-V4-Flash at TP 16: FP8 attention / shared expert / router, MXFP4 routed experts, and
    # the embedding and LM head in bf16 as the checkpoint stores them (2 x 129,280 x 4096 x 2 B).
    config = load_build_config(REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml")
    plan = plan_memory(config.deployment)
    attention = (284_000_000_000 - 43 * 256 * 3 * 4096 * 2048 - 43 * (3 * 4096 * 2048 + 4096 * 256)
                 - 2 * 129280 * 4096) // 43
    assert attention == 111_356_475
    layer = (attention + 3 * 4096 * 2048 + 4096 * 256) * 1 + 256 * 3 * 4096 * 2048 * (4 + 8 / 32) / 8
    assert plan.weights_per_gpu_bytes == math.ceil((43 * layer + 2 * 129280 * 4096 * 2) / 16) == 9_700_213_119


def test_dspark_drafter_weights_are_three_v4_blocks_and_the_markov_head_by_hand():
    # The embedded DSpark drafter at TP 16: 3 DeepSeek-V4 blocks (FP8 attention / shared expert /
    # router, MXFP4 routed experts), the Markov head 2 x 129,280 x 256 and fc 3 x 4096 x 4096 in FP8,
    # and no embedding or LM head of its own (it reads the target's).
    config = load_build_config(REPO / "build_configs" / "deepseek-v4-flash-dspark.yaml")
    plan = plan_memory(config.deployment)
    block = (111_356_475 + 3 * 4096 * 2048 + 4096 * 256) * 1 + 256 * 3 * 4096 * 2048 * (4 + 8 / 32) / 8
    head_and_fc = 2 * 129280 * 256 + 3 * 4096 * 4096
    assert plan.drafter_per_gpu_bytes == math.ceil((3 * block + head_and_fc) / 16) == 674_805_740


def test_tied_embeddings_count_the_one_shared_matrix_once():
    # No shipped target ties its LM head to its embedding; one that did stores one vocab x hidden
    # matrix, not two.
    untied = TARGETS["Qwen/Qwen3-8B"]
    tied = dataclasses.replace(untied, tie_embeddings=True)
    assert untied.embedding_params() == 2 * 151936 * 4096
    assert tied.embedding_params() == 151936 * 4096
    assert untied.total_params() - tied.total_params() == 151936 * 4096


def test_gpu_memory_is_what_the_device_reports():
    # nvidia-smi memory.total: H100 80GB HBM3 81,559 MiB, H200 143,771 MiB, B200 183,359 MiB; the
    # data sheets' 80 / 141 / 180 "GB" read as 10^9 bytes are 6-7 % short of that.
    assert [get_gpu(name).memory_bytes for name in ("H100", "H200", "B200")] == [
        81_559 * 2**20, 143_771 * 2**20, 183_359 * 2**20]
    assert get_gpu("B300").memory_bytes == 288_000_000_000  # no device figure: the data sheet's


def test_peak_flops_take_each_precisions_tensor_core_rate_and_hopper_runs_fp4_at_fp8():
    # data sheets' dense TFLOPS (BF16, FP8, FP4): H100 989 / 1979 / none, B200 2250 / 4500 / 9000;
    # 2 bytes a parameter is BF16, 1 FP8, NVFP4's 4 bits plus an 8-bit scale per 16 is 0.5625
    rates = {name: [get_gpu(name).peak_flops(b) for b in (2, 1, 0.5625)] for name in ("H100", "B200")}
    assert rates == {"H100": [989e12, 1979e12, 1979e12], "B200": [2250e12, 4500e12, 9000e12]}


def test_a_deployment_takes_each_fields_least_value_and_keeps_its_documented_defaults():
    # the least each bounded field takes: one of everything, no reserve, the whole free memory, port 1,
    # acceptance rates of exactly 0 and 1; and one past a bound refused
    least = _deployment(nodes=1, replicas=1, tensor_parallel_size=1, pipeline_parallel_size=1,
                        moe_expert_parallel_size=1, max_batch_size=1, max_seq_len=16, max_num_tokens=1,
                        free_gpu_memory_fraction=1.0, runtime_reserve_gib=0, min_concurrency=1, port=1,
                        mean_context_len=1, acceptance_by_position=[0.0, 1.0], acceptance_rate_window_size=1)
    assert least.context_len == 1 and least.acceptance_by_position == [0.0, 1.0]
    assert _deployment(acceptance_by_position=None).acceptance_by_position is None
    assert _deployment(acceptance_by_position=[0.5]).acceptance_by_position == [0.5]
    for field, value in (("acceptance_by_position", [1.5]), ("acceptance_by_position", [-0.1]),
                         ("free_gpu_memory_fraction", 1.5), ("port", 0)):
        with pytest.raises(ValueError, match=field):
            _deployment(**{field: value})
    default = _deployment()
    assert (default.replicas, default.pipeline_parallel_size, default.min_concurrency) == (1, 1, 1)
    assert default.enable_block_reuse is True and default.acceptance_rate_window_size == 256


@pytest.mark.parametrize("image, pinned", [
    ("nvcr.io/nvidia/tritonserver:25.08-trtllm-python-py3", True),
    ("localhost:5000/trtllm:1.0", True),  # a registry's port, then the tag
    ("trtllm:1.0", True),  # no registry, no path
    ("nvcr.io/nvidia/tensorrt-llm/release@sha256:" + "0" * 64, True),
    ("trtllm:latest@sha256:" + "0" * 64, True),  # a digest pins even :latest
    ("localhost:5000/trtllm", False),  # a port is not a tag
    ("trtllm", False),
])
def test_an_image_is_pinned_by_a_tag_after_its_last_slash_or_by_a_digest(image, pinned):
    if pinned:
        assert _deployment(image=image).image == image
    else:
        with pytest.raises(ValueError, match="pin the image to a release tag or digest"):
            _deployment(image=image)
