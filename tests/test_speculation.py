"""Speculation under load: the roofline step cost, `draft_len_schedule` for the real configs against
TensorRT-LLM's rules, the acceptance cut-off, and where a drafter's acceptance comes from."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import yaml
from click.testing import CliRunner

from trtspec.bench.acceptance import conditional_acceptance, replace_refusal, stored_cycles, write_acceptance
from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.errors import ConfigError
from trtspec.plan.models import get_target
from trtspec.plan.roofline import RooflineCost
from trtspec.plan.speculation import constant_rate, format_speculation, plan_batches, plan_speculation
from trtspec.spec.cost import expected_tokens, load_acceptance, survival
from trtspec.trtllm.args import llm_args
from trtspec.trtllm.fields import DYNAMIC_DRAFT_LEN_TYPES, check_draft_len_schedule

from .conftest import REPO
from .test_planner import REAL_CONFIGS


def _config(name: str, **deployment):
    config = load_build_config(REPO / "build_configs" / name)
    if deployment:
        config = config.model_copy(update={"deployment": config.deployment.model_copy(update=deployment)})
    return config


def _draft_len_at(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM's reading: the first key >= batch gives the length; past the last key, 0."""
    for key in sorted(schedule):
        if batch <= key:
            return schedule[key]
    return 0


@pytest.mark.parametrize("name", REAL_CONFIGS)
def test_schedule_follows_trtllm_rules_and_beats_both_fixed_choices(name):
    config = _config(name)
    plan = plan_speculation(config)
    schedule = plan.draft_len_schedule
    check_draft_len_schedule(schedule, plan.max_draft_len, name)  # raises on a broken rule
    assert schedule[min(schedule)] == plan.max_draft_len
    lengths = [schedule[k] for k in sorted(schedule)]
    assert lengths == sorted(lengths, reverse=True) and min(lengths) >= 0
    assert max(schedule) == config.deployment.max_batch_size  # nothing left to the implicit 0
    for b in range(1, config.deployment.max_batch_size + 1):
        assert _draft_len_at(schedule, b) == plan.draft_len[b - 1]
        assert plan.rate("schedule", b) >= plan.rate("always", b) * (1 - 1e-12), (name, b)
        assert plan.rate("schedule", b) >= plan.rate("never", b) * (1 - 1e-12), (name, b)


def test_speculation_turns_down_as_the_batch_grows():
    # Qwen3-8B on one H200: at batch 32 x 16 tokens the verify forward is compute bound
    plan = plan_speculation(_config("qwen3-8b-dflash-h200.yaml"))
    assert plan.draft_len[0] == 15 and plan.draft_len[-1] < 15
    assert plan.rate("schedule", 32) > 1.2 * plan.rate("always", 32)
    # a drafter that is rarely right stops speculating beyond batch 1
    poor = plan_speculation(_config("qwen3-8b-dflash-h200.yaml", acceptance_by_position=[0.1] * 15))
    assert poor.draft_len_schedule == {1: 15, 32: 0}
    assert poor.acceptance_source == "deployment.acceptance_by_position"


def test_roofline_shapes():
    dep = _config("qwen3-8b-dflash-h200.yaml").deployment
    cost = RooflineCost(dep, "dflash")
    # batch 1: reading the weights dominates, so 15 more tokens cost (almost) nothing
    assert cost.target_seconds(1, 15) == pytest.approx(cost.target_seconds(1, 0), rel=0.01)
    assert cost.target_seconds(32, 15) > 2 * cost.target_seconds(32, 0)
    # Qwen3-8B bf16 = 16.4 GB at 80 % of 4.8 TB/s: about 4.3 ms
    assert 3.5e-3 < cost.target_seconds(1, 0) < 5e-3
    # a parallel drafter drafts a block in one forward; EAGLE-3 chains one forward per draft
    assert cost.draft_seconds(1, 15) < 1.2 * cost.draft_seconds(1, 1)
    eagle = RooflineCost(_config("qwen3-8b-eagle3.yaml").deployment, "eagle3")
    assert eagle.draft_seconds(1, 7) == pytest.approx(7 * eagle.draft_seconds(1, 1))
    # DFlash reads the target's LM head (its vocab x hidden, bf16); EAGLE-3's own head is in its weights
    qwen = get_target("Qwen/Qwen3-8B")
    assert cost.drafter.head_bytes == qwen.vocab * qwen.hidden * 2 and cost.drafter.head_flops > 0
    assert eagle.drafter.head_bytes == eagle.drafter.head_flops == 0
    # MoE: more tokens wake more experts, so verifying costs more than on a dense model
    moe = RooflineCost(_config("gpt-oss-120b-dflash-b300-tp8.yaml").deployment, "dflash")
    assert moe.target_seconds(1, 7) > 1.2 * moe.target_seconds(1, 0)


def test_plain_decoding_rate_is_one_token_per_request_per_step():
    config = _config("qwen3-8b-dflash-h200.yaml")
    plan, cost = plan_speculation(config), RooflineCost(config.deployment, "dflash")
    for batch in (1, 2, 32):
        assert plan.rate("never", batch) == pytest.approx(batch / cost.seconds(batch, 0))


def test_acceptance_threshold_of_one_draft_is_its_extra_step_time():
    # k = 1: 1 + c = T(1, 1) / T(1, 0), and the acceptance rate of one draft is c itself
    config = _config("qwen3-8b-eagle3.yaml")
    config = config.model_copy(update={"drafter": config.drafter.model_copy(update={"num_draft_tokens": 1})})
    cost = RooflineCost(config.deployment, "eagle3")
    threshold = plan_speculation(config).acceptance_rate_threshold
    assert threshold == round(cost.seconds(1, 1) / cost.seconds(1, 0) - 1, 4) > 0


def test_draft_lengths_fit_max_num_tokens_in_one_forward():
    # b x (k + 1) <= 16 tokens: k <= 16 // b - 1, i.e. 15, 7, 3, 1 at b = 1, 2, 4, 8 and 0 from b = 16
    plan = plan_speculation(_config("qwen3-8b-dflash-h200.yaml", max_num_tokens=16))
    for b in range(1, 33):
        assert plan.best_len[b - 1] <= max(0, 16 // b - 1) and plan.draft_len[b - 1] <= max(0, 16 // b - 1)
    assert plan.draft_len[-1] == plan.best_len[-1] == 0
    # "always k=15" runs 15 drafts where they fit (b = 1) and none where they do not
    assert plan.rate("always", 1) == plan.rate("schedule", 1) > plan.rate("never", 1)
    assert plan.rate("always", 2) == plan.rate("never", 2)


def test_inspect_prints_powers_of_two_then_the_largest_batch():
    assert plan_batches(1) == [1]
    assert plan_batches(32) == [1, 2, 4, 8, 16, 32]
    assert plan_batches(48) == [1, 2, 4, 8, 16, 32, 48]


def test_inspect_notes_a_batch_one_length_the_cost_model_would_not_pick():
    plan = plan_speculation(_config("qwen3-8b-dflash-h200.yaml"))
    assert plan.best_len[:2] == [15, 15] and "note:" not in format_speculation(plan, 32, True)
    shorter = dataclasses.replace(plan, best_len=[7, *plan.best_len[1:]])
    assert "note: at batch 1 the cost model prefers k = 7" in format_speculation(shorter, 32, True)


def test_constant_rate_spans_a_drafter_never_and_always_right():
    # 1 + c + ... + c^k = tau: c = 0 at tau 1, c = 1 at tau k + 1, and 1 + c = 1.5 at k = 1
    assert constant_rate(1, 5) == pytest.approx(0, abs=1e-12)
    assert constant_rate(6, 5) == pytest.approx(1)
    assert constant_rate(1.5, 1) == pytest.approx(0.5)
    for tau in (0.99, 6.01):
        with pytest.raises(ConfigError, match=rf"mean τ {tau} is impossible with 5 drafts \(1 ≤ τ ≤ 6\)"):
            constant_rate(tau, 5)


def test_acceptance_threshold_is_the_break_even_at_batch_one():
    config = _config("llama3.1-8b-dflash.yaml")
    plan = plan_speculation(config)
    k = plan.max_draft_len
    cost = RooflineCost(config.deployment, "dflash")
    # a constant-rate drafter at the threshold's accepted/drafted rate breaks even with no drafter
    c = constant_rate(1 + plan.acceptance_rate_threshold * k, k)
    rate = expected_tokens(survival([c] * k), k) / cost.seconds(1, k)
    assert rate == pytest.approx(1 / cost.seconds(1, 0), rel=1e-3)
    assert 0 < plan.acceptance_rate_threshold < 0.5


def test_generated_speculative_config_carries_the_schedule(tmp_path):
    for name in ("llama3.1-8b-dflash.yaml", "deepseek-v4-flash-dspark.yaml"):
        config = _config(name)
        spec = llm_args(config, for_triton=False)["speculative_config"]
        plan = plan_speculation(config)
        assert spec["acceptance_rate_threshold"] == plan.acceptance_rate_threshold
        assert spec["acceptance_rate_window_size"] == 256
        if spec["decoding_type"] in DYNAMIC_DRAFT_LEN_TYPES:
            assert spec["draft_len_schedule"] == plan.draft_len_schedule
        else:  # DSpark's draft length is its block size: TensorRT-LLM does not vary it
            assert "draft_len_schedule" not in spec
    result = CliRunner().invoke(main, ["build", str(REPO / "build_configs" / "llama3.1-8b-dflash.yaml"),
                                       "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = yaml.safe_load((tmp_path / "trtllm-serve.yaml").read_text())["speculative_config"]
    assert written["draft_len_schedule"] == {32: 9}


def test_inspect_prints_schedule_and_tokens_per_second():
    result = CliRunner().invoke(main, ["inspect", str(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml")])
    assert result.exit_code == 0, result.output
    assert "draft_len_schedule {11: 15" in result.output
    rows = [line.split() for line in result.output.splitlines() if line.strip().startswith(("1 ", "32 "))]
    assert [r[0] for r in rows] == ["1", "32"]
    assert rows[1][1] == "6" and rows[1][-1].endswith("×")
    as_json = CliRunner().invoke(main, ["inspect", str(REPO / "build_configs" / "qwen3-8b-dflash-h200.yaml"),
                                        "--json"])
    speculation = json.loads(as_json.output)["speculation"]
    assert len(speculation["tokens_per_s"]["never"]) == 32


def test_acceptance_json_beside_the_drafter_is_used(tmp_path):
    drafter = tmp_path / "weights" / "LLaMA3.1-8B-Instruct-DFlash-UltraChat"
    drafter.mkdir(parents=True)
    config_path = tmp_path / "llama.yaml"
    shutil.copy(REPO / "build_configs" / "llama3.1-8b-dflash.yaml", config_path)
    # the drafter's folder without acceptance.json: the method's default
    assert plan_speculation(load_build_config(config_path)).acceptance_source.startswith("default c = ")
    write_acceptance(drafter, [0.9] * 9, cycles=10, measured_with="test")
    plan = plan_speculation(load_build_config(config_path))
    assert plan.acceptance == [0.9] * 9 and plan.acceptance_source.endswith("acceptance.json")
    write_acceptance(drafter, [0.9] * 4, cycles=10, measured_with="test")
    with pytest.raises(ConfigError, match="4 positions measured, drafter.num_draft_tokens is 9"):
        plan_speculation(load_build_config(config_path))


def test_shipped_drafters_carry_measured_acceptance():
    for name in ("tiny-dflash-b16", "tiny-dspark-b15", "tiny-eagle3", "tiny-draft"):
        rates = load_acceptance(REPO / "trtspec" / "assets" / name)
        assert rates and all(0 < r <= 1 for r in rates), name
        body = json.loads((REPO / "trtspec" / "assets" / name / "acceptance.json").read_text())
        assert body["measured_with"].startswith("trtspec bench") and body["cycles"] > 100


@pytest.mark.parametrize("rates,said", [
    # float() over a string's characters read "10" as [1.0, 0.0], and a mapping's keys as rates
    ("10", r"acceptance_by_position must be a list of rates in \[0, 1\], got '10'"),
    ({"1": 0.5}, r"acceptance_by_position must be a list of rates in \[0, 1\], got \{'1': 0.5\}"),
    # float() read the string "0.5" and true as rates
    ([0.9, "0.5"], "must be rates in \\[0, 1\\], one or more, got '0.5'"),
    ([True, 0.5], "must be rates in \\[0, 1\\], one or more, got True"),
    ([0.9, 10**400], "one or more, got 1000"),  # float() overflowed: a traceback
])
def test_acceptance_json_of_wrong_types_is_refused_naming_the_field(tmp_path, rates, said):
    (tmp_path / "acceptance.json").write_text(json.dumps({"acceptance_by_position": rates}))
    with pytest.raises(ConfigError, match=said):
        load_acceptance(tmp_path)


def test_draft_model_without_acceptance_is_refused_with_the_fix():
    config = _config("llama3.1-8b-dflash.yaml")
    drafter = config.drafter.model_copy(update={"method": "draft_model"})
    config = config.model_copy(update={"drafter": drafter})
    with pytest.raises(ConfigError, match="trtspec bench --write-acceptance"):
        plan_speculation(config)


def test_conditional_acceptance_from_cycles():
    # (drafted, accepted): position 1 reached 4 times, passed 3; position 2 reached 3, passed 1;
    # the (1, 1) cycle offered no second draft and says nothing about position 2
    cycles = [(3, 0), (3, 1), (3, 3), (1, 1)]
    assert conditional_acceptance(cycles, 3) == [0.75, 0.5, 1.0]
    assert constant_rate(6.49, 15) == pytest.approx(0.86, abs=0.005)


@pytest.mark.parametrize(
    "schedule, message",
    [
        ({1: 4, 8: 2}, "must equal max_draft_len 5"),
        ({4: 5, 8: 6}, "must lie in 0..max_draft_len"),
        ({0: 5}, "must be an integer >= 1"),
        ({4: 5, 8: 2, 16: 3}, "drafts more at a larger batch"),
        ({4: 5, 8: -1}, "must lie in 0..max_draft_len"),
    ],
)
def test_schedule_rules_are_enforced(schedule, message):
    with pytest.raises(ConfigError, match=message):
        check_draft_len_schedule(schedule, 5, "test")


@pytest.mark.parametrize(
    "schedule, max_draft_len",
    [
        ({1: 5, 8: 2, 32: 0}, 5),  # a length of 0 turns speculation off for the largest batches
        ({1: 5, 4: 5, 16: 3}, 5),  # equal lengths at larger batches: non-increasing, not decreasing
        ({4: 3, 16: 1}, None),  # no max_draft_len to hold the smallest key to: only the shape counts
    ],
)
def test_schedule_rules_accept_zero_lengths_plateaus_and_an_unknown_max(schedule, max_draft_len):
    """TensorRT-LLM takes draft lengths >= 0 (not > 0), lengths that stay level as the batch grows,
    and a schedule checked without a max_draft_len; none of them is refused."""
    check_draft_len_schedule(schedule, max_draft_len, "test")


def test_write_acceptance_keeps_a_stored_file_measured_over_more_cycles(tmp_path):
    """`bench --write-acceptance` writes beside the drafter; a later run over fewer cycles than the
    stored file may not overwrite it silently: it exits 1 naming the file and both counts."""
    drafter = tmp_path / "tiny-dflash-b16"
    shutil.copytree(REPO / "trtspec" / "assets" / "tiny-dflash-b16", drafter)
    (drafter / "acceptance.json").unlink()
    config = yaml.safe_load((REPO / "build_configs" / "tiny-dflash.yaml").read_text())
    config["drafter"]["path"] = str(drafter)
    config_path = tmp_path / "dflash.yaml"
    config_path.write_text(yaml.safe_dump(config))
    args = ["bench", str(config_path), "--tasks", "math", "--prompts", "1", "--max-tokens", "24", "--no-hf",
            "--out", str(tmp_path / "bench"), "--write-acceptance"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    body = json.loads((drafter / "acceptance.json").read_text())
    assert body["cycles"] > 0 and f"({body['cycles']} cycles)" in first.output
    body["cycles"] += 1000  # as if a larger run had written it
    (drafter / "acceptance.json").write_text(json.dumps(body))
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 1
    assert f"measured over {body['cycles']} cycles, this run over {body['cycles'] - 1000}" in second.output
    assert str(drafter / "acceptance.json") in second.output
    assert json.loads((drafter / "acceptance.json").read_text()) == body


@pytest.mark.parametrize("asset", ["tiny-dflash-b16", "tiny-dspark-b15", "tiny-eagle3", "tiny-draft"])
def test_the_shipped_acceptance_files_are_as_write_acceptance_writes_them(tmp_path, asset):
    """`bench --write-acceptance` over a shipped file rewrites it byte for byte from its own figures
    (a rerun's diff shows the figures that changed, nothing of the layout)."""
    shipped = REPO / "trtspec" / "assets" / asset / "acceptance.json"
    body = json.loads(shipped.read_text())
    rates, cycles = body["acceptance_by_position"], body["cycles"]
    written = write_acceptance(tmp_path, rates, cycles, body["measured_with"])
    assert written.read_bytes() == shipped.read_bytes()


def test_a_stored_acceptance_is_replaced_by_as_many_cycles_or_more(tmp_path):
    """The stored count is 0 where no file, a hand-written one naming no count or an unreadable one
    is (any run replaces it); a run over as many cycles as stored replaces it, one fewer may not."""
    assert stored_cycles(tmp_path) == 0
    (tmp_path / "acceptance.json").write_text('{"acceptance_by_position": [0.5]}')
    assert stored_cycles(tmp_path) == 0 and replace_refusal(tmp_path, 0) is None
    (tmp_path / "acceptance.json").write_text("{not json")
    assert stored_cycles(tmp_path) == 0
    write_acceptance(tmp_path, [0.5], 40, "test")
    assert stored_cycles(tmp_path) == 40 and replace_refusal(tmp_path, 40) is None
    assert "measured over 40 cycles, this run over 39" in replace_refusal(tmp_path, 39)


def test_deepseek_v4_csa_layers_attend_top_k_rows_not_every_compressed_row():
    # DeepSeek-V4-Flash, FP8 KV, TP 16: 21 CSA layers (ratio 4), 20 HCA layers (ratio 128), all 43
    # with a 128-token window. QK^T + PV cost 4 x 64 heads x 512 = 131,072 FLOPs per query and row.
    cost = RooflineCost(_config("deepseek-v4-flash-dspark.yaml").deployment, "dspark")
    m = cost.target
    # per context token: HCA rows, and the CSA indexer (64 heads x 128, 2 FLOPs) scoring each row
    assert m.attn_flops_ctx == pytest.approx((131_072 * 20 / 128 + 2 * 64 * 128 * 21 / 4) / 16)
    # CSA attends at most index_topk = 512 selected rows (config.json index_topk)
    assert (m.attn_flops_selected, m.index_topk) == (pytest.approx(131_072 * 21 / 16), 512)
    # and every layer attends its 128-token window
    assert m.attn_flops_fixed == pytest.approx(131_072 * 43 * 128 / 16)
    # reads: HCA rows of 584 B and the CSA indexer's 132 B rows for every 4 tokens, 584 B per pick
    assert m.kv_bytes_ctx == pytest.approx(584 * 20 / 128 + 132 * 21 / 4)
    assert m.kv_bytes_selected == 584 * 21


def test_roofline_seconds_of_qwen3_8b_on_h200_by_hand():
    """Qwen3-8B bf16 on one H200 (4.8 TB/s at 80 %, 989 dense BF16 TFLOP/s at 60 %), mean context
    8192 / 4 = 2048: per layer 192,937,984 params, LM head 151,936 x 4096, KV 2 x 8 x 128 x 2 B."""
    cost = RooflineCost(_config("qwen3-8b-dflash-h200.yaml").deployment, "dflash")
    layers, head, kv = 36 * 192_937_984, 151_936 * 4096, 36 * 4096 * 2048  # params, params, bytes
    # batch 1, no drafts: bound by reading the weights, the LM head and one request's KV
    assert cost.target_seconds(1, 0) == pytest.approx((2 * (layers + head) + kv) / 3.84e12)
    # batch 32 x 16 tokens: bound by FLOPs, 2 per parameter and 4 x 32 heads x 128 per context token
    tokens = 32 * 16
    flops = tokens * (2 * layers + 2 * head + 2048 * 36 * 4 * 32 * 128)
    assert cost.target_seconds(32, 15) == pytest.approx(flops / 989e12 / 0.6)
    # DFlash: 5 layers + fc (1,048,576,000 params), the target's LM head, its 5-layer context cache
    drafter = 2 * (1_048_576_000 + head) + 5 * 4096 * 2048
    assert cost.draft_seconds(1, 15) == pytest.approx(drafter / 3.84e12)
    # batch 32: 32 x 16 tokens through it, logits for 32 x 15, attention over 2048 tokens in 5 layers
    flops = 32 * 16 * (2 * 1_048_576_000 + 2048 * 5 * 4 * 32 * 128) + 32 * 15 * 2 * head
    assert cost.draft_seconds(32, 15) == pytest.approx(flops / 989e12 / 0.6)
    # no drafter in the deployment: the step is the target's alone
    alone = RooflineCost(_config("qwen3-8b-dflash-h200.yaml", drafter_id=None).deployment, "dflash")
    assert (alone.draft_seconds(1, 15), alone.seconds(1, 15)) == (0.0, cost.target_seconds(1, 15))
    # EAGLE-3: 399,507,456 params with its own draft LM head, one layer of context cache, per draft
    eagle = RooflineCost(_config("qwen3-8b-eagle3.yaml").deployment, "eagle3")
    assert eagle.draft_seconds(1, 7) == pytest.approx(7 * (2 * 399_507_456 + 4096 * 2048) / 3.84e12)


@pytest.mark.parametrize("nodes, latency, bandwidth", [(1, 8e-6, 900e9 / 2), (2, 25e-6, 50e9)])
def test_roofline_tp_2_adds_two_all_reduces_per_layer(nodes, latency, bandwidth):
    # half of every byte read at TP 2, plus 2 x 36 all-reduces of one token's 4096 bf16 activations,
    # each a latency and 2 (tp - 1) / tp x 8192 B over NVLink (half its 900 GB/s) or the 50 GB/s NIC
    dep = _config("qwen3-8b-dflash-h200.yaml", nodes=nodes, gpus_per_node=2 // nodes, tensor_parallel_size=2)
    cost = RooflineCost(dep.deployment, "dflash")
    read = (2 * (36 * 192_937_984 + 151_936 * 4096) + 36 * 4096 * 2048) / 2 / 3.84e12
    assert cost.target_seconds(1, 0) == pytest.approx(read + 72 * (latency + 8192 / bandwidth))


def test_roofline_pipeline_stages_run_one_after_another():
    # PP 2: each stage reads 18 layers, the LM head and 18 layers of KV; a token passes both stages
    cost = RooflineCost(_config("qwen3-8b-dflash-h200.yaml", gpus_per_node=2, pipeline_parallel_size=2)
                        .deployment, "dflash")
    stage = (2 * (18 * 192_937_984 + 151_936 * 4096) + 18 * 4096 * 2048) / 3.84e12
    assert cost.target_seconds(1, 0) == pytest.approx(2 * stage)


def test_roofline_moe_reads_the_experts_its_tokens_wake_by_hand():
    """gpt-oss-120b on 8 B300s (8 TB/s at 80 %; 2250 BF16, 13,125 FP4 TFLOP/s at 60 %), context
    32768 / 4 = 8192. Per GPU: 36 layers of 26,910,720 bf16 params and 128 experts of 3 x 2880^2
    MXFP4 (0.53125 B) params, 4 routed per token; LM head 201,088 x 2880 bf16; KV per request (1 KV
    head per GPU, 2 x 64 x 2 B = 256 B a layer and token): 18 full layers x 8192 + 18 sliding x 128."""
    cost = RooflineCost(_config("gpt-oss-120b-dflash-b300-tp8.yaml").deployment, "dflash")
    dense, expert, head = 36 * 26_910_720, 36 * 3 * 2880 * 2880, 201_088 * 2880
    kv = 8192 * 18 * 256 + 18 * 128 * 256

    def all_reduces(tokens):  # 72 of 2 x 7/8 x tokens x 2880 x 2 B over NVLink at 1800 / 2 GB/s
        return 72 * (8e-6 + 2 * 7 / 8 * tokens * 2880 * 2 / 900e9)

    def read(tokens, batch):  # the T tokens wake 128 x (1 - (1 - 4/128)^T) experts of 128
        woken = 1 - (1 - 4 / 128) ** tokens
        return ((2 * dense + woken * 128 * expert * 0.53125 + 2 * head) / 8 + batch * kv) / 6.4e12

    assert cost.target_seconds(1, 0) == pytest.approx(read(1, 1) + all_reduces(1))
    assert cost.target_seconds(1, 7) == pytest.approx(read(8, 1) + all_reduces(8))
    assert cost.target_seconds(256, 15) == pytest.approx(read(4096, 256) + all_reduces(4096))
    # batch 512 x 16 tokens: FLOP-bound; experts on FP4 tensor cores, the rest (and attention over
    # 8192 tokens in 18 layers, 128 in the other 18, 4 x 64 heads x 64) on BF16
    attention = 4 * 64 * 64 * 18 * (8192 + 128)
    flops = 8192 * ((2 * dense + 2 * head + attention) / 2250e12 + 2 * 4 * expert / 13125e12) / 8
    assert cost.target_seconds(512, 15) == pytest.approx(flops / 0.6 + all_reduces(8192))


def test_roofline_deepseek_v4_reads_at_most_index_topk_selected_rows_per_csa_layer():
    # Memory-bound batch 4 on 16 H200s (4.8 TB/s at 80 %), FP8 KV: a mean context of 4096 instead
    # of 1024 reads, per request, 3072 more context tokens at 584 x 20 / 128 + 132 x 21 / 4 B and
    # 512 instead of 1024 / 4 = 256 selected rows at 584 x 21 B (21 CSA layers pick min(context / 4, 512)).
    def seconds(context, batch, draft_len):
        return RooflineCost(_config("deepseek-v4-flash-dspark.yaml", mean_context_len=context).deployment,
                            "dspark").target_seconds(batch, draft_len)

    per_request = 3072 * (584 * 20 / 128 + 132 * 21 / 4) + (512 - 256) * 584 * 21
    assert seconds(4096, 4, 0) - seconds(1024, 4, 0) == pytest.approx(4 * per_request / 3.84e12, rel=1e-6)
    # FLOP-bound 1024 x 16 tokens (989 BF16 TFLOP/s at 60 %): the same 3072 tokens at 131,072 x 20 / 128
    # + 2 x 64 x 128 x 21 / 4 FLOPs and 256 more selected rows at 131,072 x 21, over TP 16, per query
    per_token = (3072 * (131_072 * 20 / 128 + 2 * 64 * 128 * 21 / 4) + 256 * 131_072 * 21) / 16
    assert seconds(4096, 1024, 15) - seconds(1024, 1024, 15) == pytest.approx(
        16384 * per_token / 989e12 / 0.6, rel=1e-6)
