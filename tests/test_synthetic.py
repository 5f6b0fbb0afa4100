"""`trtspec profile --synthetic`: real architectures with random weights, the static-cache forward
behind the CUDA-graph timing, the floors and the projected speedups (the CPU runs the small shape)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch
from click.testing import CliRunner
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from trtspec.bench.device_timer import L2_FLUSH_BYTES, Deadline, DeviceTimer, flush_buffer
from trtspec.bench.loop_overhead import tiny_pipeline
from trtspec.bench.static_target import StaticKVTarget
from trtspec.bench.synthetic import (
    ForwardBytes,
    SyntheticSettings,
    build_drafter,
    build_target,
    profile_synthetic,
    small_architecture,
)
from trtspec.bench.synthetic_report import finish, headline, inconsistencies, projections, write_outputs
from trtspec.cli import main
from trtspec.config import ScheduleConfig
from trtspec.plan.gpus import GPUS, gpu_for_device
from trtspec.plan.models import DRAFTERS, TARGETS
from trtspec.prompts import load_prompts

from .conftest import REPO


@pytest.mark.parametrize("model_cls,config_cls",
                         [(Qwen3ForCausalLM, Qwen3Config), (LlamaForCausalLM, LlamaConfig)])
def test_static_cache_forward_equals_the_models_own(model_cls, config_cls):
    torch.manual_seed(0)
    config = config_cls(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=16,
                        max_position_embeddings=128)
    model = model_cls(config).eval()
    ids = torch.randint(0, 300, (2, 20))
    static = StaticKVTarget(model, max_batch=3, max_len=48)
    static.fill_random(torch.Generator().manual_seed(1))  # slots past a row's position must not matter
    with torch.inference_mode():
        want = model(ids).logits  # [2, 20, V], no cache
        prefill = static.forward(ids[:, :13], torch.arange(13).expand(2, 13), kv_len=13)
        verify = static.forward(ids[:, 13:], torch.arange(13, 20).expand(2, 7), kv_len=20)
        wide = static.forward(ids[:, 13:14], torch.tensor([[13], [13]]), kv_len=40)  # a larger bucket
    torch.testing.assert_close(prefill, want[:, :13], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(verify, want[:, 13:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(wide, want[:, 13:14], atol=1e-5, rtol=1e-5)


def test_static_cache_of_a_config_without_head_dim_sizes_heads_from_the_hidden_size():
    """A config that names no head_dim (older Llama config.json files) has heads of hidden_size /
    heads, as the model's own attention takes them: the cache is sized so, and the forward still
    equals the model's."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    model.config.head_dim = None  # read at the model's construction only; the static target reads it now
    static = StaticKVTarget(model, max_batch=1, max_len=16)
    assert static.k_cache[0].shape == (1, 2, 16, 8) and static.v_cache[1].shape == (1, 2, 16, 8)
    ids = torch.randint(0, 300, (1, 6))
    with torch.inference_mode():
        got = static.forward(ids, torch.arange(6)[None], kv_len=6)
        want = model(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# the real models the profile builds: (target, its DFlash drafter, the target's model_type, block size)
PLANNED = [
    ("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "qwen3", 16),
    ("meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", "llama", 10),
]


@pytest.mark.parametrize("target_id,drafter_id,model_type,block", PLANNED)
def test_full_scale_models_are_the_planned_architectures(target_id, drafter_id, model_type, block):
    """Built on the meta device (no memory): parameters born in bfloat16, counts as trtspec/plan
    derives them (which leaves out norms: < 0.01%)."""
    meta = torch.device("meta")
    target = build_target(TARGETS[target_id], model_type, meta, torch.bfloat16, 9000, seed=0)
    drafter = build_drafter(DRAFTERS[drafter_id], TARGETS[target_id], block, meta, torch.bfloat16, 9000)
    for model, arch in ((target, TARGETS[target_id]), (drafter, DRAFTERS[drafter_id])):
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        count = sum(p.numel() for p in model.parameters())
        assert 0 <= count - arch.total_params() < 1e-4 * count
    taps = [1, 9, 17, 25, 33] if model_type == "qwen3" else [1, 8, 15, 22, 29]  # z-lab's spread
    assert drafter.spec.target_layer_ids == taps
    assert torch.get_default_dtype() == torch.float32
    # the target is the named family's model (Qwen3's attention has q/k norms, Llama's has none), and
    # the drafter's mask token is one the target's embedding holds
    assert target.config.model_type == model_type
    assert 0 <= drafter.spec.mask_token_id < TARGETS[target_id].vocab


@pytest.mark.parametrize("target_id,drafter_id,model_type,block", PLANNED)
def test_small_scale_models_keep_the_layout_and_count_every_matrix(target_id, drafter_id, model_type, block):
    """`scale: small` (6 target layers, 2 draft layers, hidden 256): both real models keep GQA 4
    (32 query heads over 8 K/V heads -> 8 over 2), and the weight matrices built are exactly what
    `total_params` counts (norm vectors aside). Worked by hand for the drafter: 2 layers of
    attention 2*256*256 + 2*256*64 = 163,840 and SwiGLU 3*256*768 = 589,824, no embeddings, and its
    `fc` over 2 taps, 2*256 -> 256 = 131,072: 1,638,400."""
    full_target, full_drafter = TARGETS[target_id], DRAFTERS[drafter_id]
    target, drafter = small_architecture(full_target, 6), small_architecture(full_drafter, 2)
    assert full_target.heads // full_target.kv_heads == target.heads // target.kv_heads == 4
    assert drafter.total_params() == 2 * (163_840 + 589_824) + 131_072
    meta = torch.device("meta")
    for model, arch in ((build_target(target, model_type, meta, torch.float32, 512, seed=0), target),
                        (build_drafter(drafter, target, block, meta, torch.float32, 512), drafter)):
        assert sum(p.numel() for p in model.parameters() if p.dim() > 1) == arch.total_params()


def test_settings_refuse_empty_or_sub_minimum_lists():
    """Every list needs an entry and each entry >= 1 (a batch, context or token count of 0 times
    nothing); a DFlash block holds the last verified token and at least one draft: >= 2. Warm-up may
    be 0 runs, a measurement needs 1 timed run."""
    SyntheticSettings.small(draft_blocks=[2], batches=[1], warmup=0, reps=1)  # the least of each
    for bad in (dict(batches=[]), dict(contexts=[64, 0]), dict(new_tokens=[0, 4]), dict(draft_batches=[]),
                dict(draft_blocks=[]), dict(draft_blocks=[4, 1]), dict(warmup=-1), dict(reps=0)):
        with pytest.raises(ValueError):
            SyntheticSettings.small(**bad)


def test_default_settings_are_the_gpu_runs_documented_grid():
    """`gpu_check` profiles with the defaults, and docs/GPU.md says what that measures: the target
    forward at batch 1..32, context 1024 and 8192, 1..64 new tokens; draft steps at B = 4, 8, 16 and
    batch 1 and 8; eager and as CUDA graphs."""
    s = SyntheticSettings()
    assert s.scale == "full" and s.batches == [1, 2, 4, 8, 16, 32] and s.contexts == [1024, 8192]
    assert s.new_tokens == [1, 2, 4, 8, 16, 32, 64] and s.draft_blocks == [4, 8, 16]
    assert s.draft_batches == [1, 8] and s.cuda_graphs is True
    # `profile --reps`' help: "with --synthetic 10 (3 at --scale small)"
    assert s.reps == 10 and SyntheticSettings.small().reps == 3


def test_forward_floors_count_each_byte_a_forward_moves():
    """Qwen3-8B in bfloat16: one token's K and V take 2 * 8 kv heads * 128 * 2 bytes = 4,096 bytes a
    layer (147,456 over the target's 36, 20,480 over the drafter's 5). Built on the meta device, the
    untied target's weights read are all its parameters but the gathered embedding table (its
    151,936 x 4,096 LM head is read whole). Batch 2, 10 cached tokens:
    - the target's forward of 3 new tokens reads its weights (1,000 bytes here), gathers 2 * 3
      embedding rows (49,152), reads K/V of 13 positions (3,833,856), writes 3 (884,736) and
      writes 6 rows of logits (1,823,232): 6,591,976;
    - the draft step of a block of 4 reads the drafter (300) and the LM head (500), the 10 context
      positions' K/V (409,600), writes the block's 4 (163,840), gathers 8 embedding rows (65,536)
      and writes logits of its 3 drafts per row (1,823,232): 2,463,008."""
    target_arch, drafter_arch = TARGETS["Qwen/Qwen3-8B"], DRAFTERS["z-lab/Qwen3-8B-DFlash-b16"]
    meta = torch.device("meta")
    target = build_target(target_arch, "qwen3", meta, torch.bfloat16, 9000, seed=0)
    drafter = build_drafter(drafter_arch, target_arch, 16, meta, torch.bfloat16, 9000)
    built = ForwardBytes.of(target_arch, target, drafter)
    table = 151_936 * 4_096 * 2
    params = sum(p.numel() for p in target.parameters())
    assert (built.target_weights, built.lm_head) == (2 * params - table, table)
    assert (built.drafter_weights, built.drafter_layers, built.element) == (
        2 * sum(p.numel() for p in drafter.parameters()), 5, 2)
    assert (built.kv_per_token(36), built.kv_per_token(5)) == (147_456, 20_480)
    # tied, the LM head is the embedding table: read whole, it stays in the weights (counted once)
    tied_arch = dataclasses.replace(target_arch, tie_embeddings=True)
    tied = build_target(tied_arch, "qwen3", meta, torch.bfloat16, 9000, seed=0)
    tied_params = sum(p.numel() for p in tied.parameters())
    assert ForwardBytes.of(tied_arch, tied, drafter).target_weights == 2 * tied_params
    sized = ForwardBytes(target_arch, target_weights=1_000, lm_head=500, drafter_weights=300,
                         drafter_layers=5, element=2)
    assert sized.target_forward(2, 10, 3) == 6_591_976
    assert sized.draft_step(2, 10, 4) == 2_463_008


def test_projection_is_tau_times_t_ar_over_the_cycle():
    at = {"batch": 1, "context": 1024}
    rows = [dict(at, new_tokens=1, eager_ms=5.0, graph_ms=4.0, floor_ms=3.5),
            dict(at, new_tokens=16, eager_ms=5.5, graph_ms=4.4, floor_ms=3.6)]
    result = {"model": "qwen3-8b", "block_size": 16, "loop_overhead": {"per_cycle_ms": 0.3},
              "settings": {"contexts": [1024]}, "target_forward": rows,
              "draft": [{"batch": 1, "context": 1024, "block": 16, "eager_ms": 1.0, "graph_ms": 0.8,
                         "floor_ms": 0.7}]}
    out = projections(result)
    assert [(p["task"], p["tau"], p["published_speedup"]) for p in out][0] == ("GSM8K", 6.55, 5.20)
    assert out[0]["mode"] == "CUDA graphs"
    assert out[0]["projected_speedup"] == pytest.approx(6.55 * 4.0 / (0.8 + 4.4 + 0.3))
    assert out[0]["floor_speedup"] == pytest.approx(6.55 * 3.5 / (0.7 + 3.6))
    result["draft"][0]["graph_ms"] = None  # one eager part makes the whole projection eager
    assert projections(result)[1]["mode"] == "eager"
    assert projections(dict(result, model="llama3.1-8b")) == []  # no published τ used for it


def test_timings_where_more_tokens_cost_less_are_called_noise():
    """Found auditing the docs (2026-12-06): on a busy CPU a profile timed T(16) at 0.04x T(1) and
    projected 90x, no word said. A forward of more tokens timed under 80 % of one of fewer is flagged
    in the headline; a dip within that is not."""
    at = {"batch": 1, "context": 64, "graph_ms": None, "floor_ms": 1.0}
    result = {"settings": {"contexts": [64]}, "block_size": 16, "draft": [], "cuda_graphs": "off",
              "target_forward": [dict(at, new_tokens=n, eager_ms=ms) for n, ms in ((1, 10.0), (4, 8.5),
                                                                                     (16, 12.0))]}
    assert inconsistencies(result) == []
    result["target_forward"][2]["eager_ms"] = 0.4
    assert inconsistencies(result) == ["batch 1, context 64: T(16) = 0.400 ms < T(1) = 10.000 ms"]
    assert headline(result)[0].startswith("**Timings inconsistent**: a forward of more tokens took under 80%")


def test_noise_is_judged_from_the_second_forward_on_and_exactly_80_percent_is_none():
    at = {"batch": 1, "context": 64, "graph_ms": None, "floor_ms": 1.0}
    result = {"target_forward": [dict(at, new_tokens=n, eager_ms=ms) for n, ms in ((1, 10.0), (2, 8.0),
                                                                                     (4, 12.0))]}
    assert inconsistencies(result) == []
    result["target_forward"][1]["eager_ms"] = 7.9
    assert inconsistencies(result) == ["batch 1, context 64: T(2) = 7.900 ms < T(1) = 10.000 ms"]


def _hand_profile() -> dict:
    """A qwen3-8b profile as `profile_synthetic` writes one, its times set by hand: contexts 1024 and
    8192, batch 1 and 2 (batch 2 twice as slow), the 8192 draft step skipped by the budget."""
    forwards = [{"batch": b, "context": c, "new_tokens": n, "eager_ms": b * e, "graph_ms": b * g,
                 "floor_ms": b * f} for b in (1, 2) for c in (1024, 8192)
                for n, e, g, f in ((1, 5.0, 3.0, 2.0), (16, 6.0, 4.0, 2.5))]
    draft = {"batch": 1, "context": 1024, "block": 16, "layers_ms": 0.3, "eager_ms": 0.6, "graph_ms": 0.5,
             "floor_ms": 0.25}
    return finish({
        "model": "qwen3-8b", "device": "NVIDIA H200", "dtype": "bfloat16", "target": "Qwen/Qwen3-8B",
        "drafter": "z-lab/Qwen3-8B-DFlash-b16", "params": {"target": 10**8, "drafter": 99_949_999},
        "block_size": 16, "torch": "2.11", "transformers": "5.17", "started": "2026-12-07T00:00:00",
        "bandwidth": {"floor_gbs": 4300.0, "floor_source": "copy"}, "cuda_graphs": "on",
        "settings": {"scale": "full", "contexts": [1024, 8192]}, "target_forward": forwards,
        "draft": [draft, dict(draft, batch=2, eager_ms=1.2, graph_ms=1.0)], "plugins": [],
        "hf_forward": [{"context": 1024, "new_tokens": 16, "eager_ms": 9.0}], "serving": [],
        "loop_overhead": {"per_cycle_ms": 0.2, "cycle_ms": 4.9, "model": "tiny", "device": "cpu",
                          "cycles": 10, "note": "n"},
        "capture_audit": {"target forward": [], "draft step": ["a host sync", "a fresh tensor"]},
        "skipped": ["draft b1 c8192 B16: time budget of 480 s spent"]})


def test_the_headline_reads_batch_1_at_the_first_context():
    """T(B) / T(1), the CUDA-graph verdict (within 1.5x of the floor: met at exactly 1.5x) and the
    draft step's share are batch 1's at the first context; a capture audit's problems are listed."""
    result = _hand_profile()
    assert headline(result) == [
        "Target forward, batch 1, context 1024: T(16) / T(1) = 1.33 (CUDA graphs); T(1) = 3.000 ms = 1.50x "
        "its floor, T(16) = 4.000 ms = 1.60x its floor.",
        "With CUDA graphs the 1-token forward is 1.50x its floor (target <= 1.5x: met); eager it is 2.50x.",
        "DFlash draft step (B = 16) = 12.5% of one target forward of 16 tokens (its layers alone 5.0%, "
        "eager; floors: 10.0%).",
        "CUDA-graph capture audit on the CPU (target forward, draft step): 2 problem(s): a host sync; "
        "a fresh tensor"]
    # a context without its draft step is not projected, and one without T(B) has no such lines
    assert {p["context"] for p in result["projections"]} == {1024}
    result["target_forward"] = [r for r in result["target_forward"] if r["new_tokens"] == 1]
    assert [line.split(" ")[0] for line in headline(result)] == ["With", "CUDA-graph"]


def test_the_markdown_shows_every_table_and_what_was_skipped(tmp_path):
    result = _hand_profile()
    md_path = write_outputs(result, tmp_path / "not" / "made" / "qwen3-8b.json")
    md = md_path.read_text()
    assert md_path == tmp_path / "not" / "made" / "qwen3-8b.md"
    assert json.loads((tmp_path / "not" / "made" / "qwen3-8b.json").read_text()) == result
    assert "Target: Qwen/Qwen3-8B (0.10 B parameters); drafter: z-lab/Qwen3-8B-DFlash-b16 (99.9 M)" in md
    assert "| 1 | 1024 | 16 | 9.000 | 6.000 |" in md  # transformers' forward beside batch 1's static cache
    # 6.55 · 3 / (0.5 + 4 + 0.2) and, at the floors, 6.55 · 2 / (0.25 + 2.5)
    assert "| GSM8K | 6.55 | 5.20x | 1024 | 4.18x | CUDA graphs | 4.76x |" in md
    assert "Decode-loop overhead per cycle: 0.200 ms of a 4.900 ms cycle (tiny on cpu, 10 cycles; n)." in md
    assert md.rstrip().endswith("Skipped: draft b1 c8192 B16: time budget of 480 s spent.")


def test_gpu_table_bandwidth():
    assert gpu_for_device("NVIDIA H200") is GPUS["H200"]
    assert gpu_for_device("NVIDIA H100 80GB HBM3") is GPUS["H100"]
    assert gpu_for_device("NVIDIA GeForce RTX 4090") is None
    assert (GPUS["H200"].hbm_tb_s, GPUS["H200"].copy_tb_s) == (4.8, 4.3)


def test_timer_overwrites_its_scratch_before_every_timed_run():
    """On CUDA a repetition would otherwise read its inputs out of the L2 the last one filled (the
    plugin kernels' inputs fit an H200's 60 MB at most of the profile's shapes) and beat a floor set
    by HBM bandwidth. The same flush runs on the CPU when asked for, which is how it is seen here."""
    assert DeviceTimer(torch.device("cuda")).flush_size == L2_FLUSH_BYTES >= 4 * 60 * 10**6
    assert DeviceTimer(torch.device("cpu")).flush_size == 0  # the CPU rehearsal stays fast
    timer = DeviceTimer(torch.device("cpu"), warmup=2, reps=5, flush_bytes=1 << 16)
    scratch = flush_buffer(timer.device, 1 << 16)
    seen = []

    def run():  # what each run finds of the scratch, then leaves in it (as its data would in L2)
        seen.append(int(scratch.count_nonzero()))
        scratch.fill_(1)

    timer.median_ms(run)
    assert len(seen) == 7 and seen[2:] == [0] * 5


def test_timer_runs_warm_ups_then_reps_and_times_cpu_runs_in_milliseconds():
    timer = DeviceTimer(torch.device("cpu"))
    calls = []
    ms = timer.median_ms(lambda: (calls.append("run"), time.sleep(0.005)), lambda: calls.append("between"))
    assert calls == ["run", "between"] * 13  # 3 warm-ups and 10 timed runs by default
    assert 5 <= ms < 1000  # a 5 ms sleep, in milliseconds


class _TwoMsTimer(DeviceTimer):
    """A timer whose every median is 2 ms: the arithmetic around the clock, without its noise."""

    __slots__ = ()

    def median_ms(self, fn, between=None):
        fn()
        return 2.0


def test_copy_bandwidth_counts_bytes_read_and_written():
    # 10**6 bytes read and 10**6 written in 2 ms: 1 GB/s
    assert _TwoMsTimer(torch.device("cpu")).copy_bandwidth_gbs(10**6) == pytest.approx(1.0)


def test_deadline_expires_once_its_seconds_are_spent():
    assert not Deadline(0.5).expired and 0 < Deadline(0.5).left() <= 0.5
    assert Deadline(0).expired and Deadline(-1).expired


def test_time_budget_skips_instead_of_running_over(tiny_loop_overhead):
    settings = SyntheticSettings.small(budget_s=1e-6)
    result = profile_synthetic("qwen3-8b", settings, "cpu", loop_overhead=tiny_loop_overhead)
    assert result["target_forward"] == [] and result["projections"] == []
    assert all(s.endswith("time budget of 0 s spent") for s in result["skipped"])
    # what was cut is the whole CPU shape, each once: contexts 64 and 256; target forwards of 1, 2,
    # 4, 8, 16 tokens (16: qwen3-8b's block) at batch 1 and 2; draft steps at B = 4, 8, 16 and batch
    # 1 and 2; transformers' own forward of 1 and 16 tokens at c64; the serving target at batch 1 and
    # 2 (the largest draft batch); the plugins: 20 + 12 + 2 + 4 + 1 = 39
    cut = sorted(s.split(":")[0] for s in result["skipped"])
    want = [f"{kind} b{b} c{c} {x}" for kind, xs in (("target", ["n1", "n2", "n4", "n8", "n16"]),
                                                      ("draft", ["B4", "B8", "B16"]))
            for b in (1, 2) for c in (64, 256) for x in xs]
    want += ["hf b1 c64 n1", "hf b1 c64 n16", "plugins"]
    want += [f"serving b{b} c64 n{n}" for b in (1, 2) for n in (1, 16)]
    assert cut == sorted(want)


@pytest.fixture(scope="module")
def tiny_loop_overhead():
    return {"per_cycle_ms": 0.5, "cycles": 10, "device": "cpu", "model": "given", "note": "test"}


def test_cli_synthetic_profile_small_on_cpu(tmp_path):
    out = tmp_path / "llama.json"
    run = CliRunner().invoke(main, ["profile", "--synthetic", "llama3.1-8b", "--out", str(out),
                                    "--new-tokens", "1,4", "--budget-s", "600"])
    assert run.exit_code == 0, run.output
    result = json.loads(out.read_text())
    assert result["model"] == "llama3.1-8b" and result["dtype"] == "float32" and result["skipped"] == []
    grid = {(r["batch"], r["context"], r["new_tokens"]) for r in result["target_forward"]}
    assert grid == {(b, c, n) for b in (1, 2) for c in (64, 256) for n in (1, 4, 10)}  # + block 10
    assert {r["block"] for r in result["draft"]} == {4, 8, 10, 16}
    for r in result["target_forward"]:
        assert r["eager_ms"] > 0 and r["graph_ms"] is None and r["floor_ms"] > 0
    assert all(r["kernel_ms"] is None and r["torch_ms"] > 0 for r in result["plugins"])
    assert [(r["context"], r["new_tokens"]) for r in result["hf_forward"]] == [(64, 1), (64, 10)]
    # the serving target at batch 1 and the largest draft batch: packed, and padded (eager on a CPU)
    assert [(r["batch"], r["new_tokens"]) for r in result["serving"]] == [(1, 1), (1, 10), (2, 1), (2, 10)]
    for r in result["serving"]:
        assert r["packed_ms"] > 0 and r["padded_ms"] > 0 and r["padded"] == "eager"
    # the loop's overhead: a share of the cycle it is part of (more than a microsecond: the loop's
    # Python alone is more), over the decode steps of the first code prompt's 24 tokens (whole blocks,
    # the prefill not one)
    loop = result["loop_overhead"]
    assert loop["device"] == "cpu" and 0.001 < loop["per_cycle_ms"] < loop["cycle_ms"]
    spec = tiny_pipeline("cpu")
    decoded = spec.decoder_for(1, ScheduleConfig(mode="full")).generate(
        spec.tokenizer.encode(load_prompts("code")[0]), 24)
    assert loop["cycles"] == decoded.num_target_calls - 1 >= 2
    assert f"Decode-loop overhead per cycle: {loop['per_cycle_ms']:.3f} ms of a {loop['cycle_ms']:.3f} ms " \
        "cycle (tiny-dflash (shipped) on cpu, " in run.output
    markdown = out.with_suffix(".md").read_text()
    assert markdown.startswith("### llama3.1-8b on cpu (float32, SMALL scaled-down shape)")
    assert "CUDA-graph decode step not measured (skipped: CUDA graphs need a CUDA device" in markdown
    assert "Kernel column: GPU-only" in markdown and markdown in run.output
    # what the GPU run captures, audited here as a capture and a replay (trtspec.models.graph_audit)
    assert result["capture_audit"] == {"target forward": [], "draft step": [], "serving padded step": []}
    assert "CUDA-graph capture audit on the CPU (target forward, draft step, serving padded step): " \
        "a capture would take each and replay it faithfully." in markdown


@pytest.mark.parametrize("args,message", [
    (["--synthetic", "gpt-7"], "no synthetic profile for model 'gpt-7'"),
    (["build_configs/tiny-dflash.yaml", "--synthetic", "qwen3-8b"], "either CONFIG or --synthetic"),
    ([], "missing CONFIG (or --synthetic MODEL)"),
    (["--synthetic", "qwen3-8b", "--new-tokens", "0,4"], "values must be >= 1"),
    (["--synthetic", "qwen3-8b", "--budget-s", "0"], "must be > 0"),
])
def test_cli_synthetic_refuses_bad_arguments(tmp_path, args, message):
    run = CliRunner().invoke(main, ["profile", "--out", str(tmp_path / "x.json"), *args])
    assert run.exit_code == 2 and message in run.output
    assert not (tmp_path / "x.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a CPU-only machine gives")
def test_cli_synthetic_refuses_cuda_without_a_gpu(tmp_path):
    run = CliRunner().invoke(main, ["profile", "--synthetic", "qwen3-8b", "--device", "cuda",
                                    "--out", str(tmp_path / "x.json")])
    assert run.exit_code == 2 and "no CUDA device is visible here" in run.output


def test_profile_replaces_no_file_it_was_not_asked_to_write(tmp_path):
    """Found fuzzing (2026-12-05): `profile` wrote its cost table over CONFIG itself, its Markdown over
    a README.md beside --out README.json, over its own JSON (--out x.md), and failed on a folder
    named as its Markdown only after measuring. Each is refused before anything runs, the files as
    they were."""
    config = tmp_path / "lk.yaml"
    config.write_text((REPO / "build_configs" / "tiny-lookup.yaml").read_text())
    before = config.read_text()
    (tmp_path / "README.md").write_text("mine\n")
    (tmp_path / "sub.md").mkdir()
    synthetic = ["--synthetic", "qwen3-8b", "--budget-s", "3", "--batch-sizes", "1", "--contexts", "64",
                 "--new-tokens", "1"]
    for args, said in [
        ([str(config), "--out", str(config)], "is CONFIG itself; give the cost table a path of its own"),
        ([*synthetic, "--out", str(tmp_path / "README.json")], "the profile's Markdown would replace"),
        ([*synthetic, "--out", str(tmp_path / "x.md")], "give a .json path"),
        ([*synthetic, "--out", str(tmp_path / "sub.json")], "sub.md is a folder; give a file"),
    ]:
        run = CliRunner().invoke(main, ["profile", *args])
        assert run.exit_code == 2 and said in " ".join(run.output.split()), run.output
    assert config.read_text() == before and (tmp_path / "README.md").read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "lk.yaml", "sub.md"]


def test_a_budget_that_measures_nothing_writes_nothing(tmp_path):
    """Found fuzzing (2026-12-05): --budget-s 1e-300 wrote a cost curve of nothing but skipped
    measurements, exit 0."""
    out = tmp_path / "s.json"
    args = ["--synthetic", "qwen3-8b", "--budget-s", "1e-300", "--batch-sizes", "1", "--contexts", "64",
            "--new-tokens", "1", "--out", str(out)]
    run = CliRunner().invoke(main, ["profile", *args])
    said = " ".join(run.output.split())
    assert run.exit_code == 1 and "nothing was measured" in said and "give a larger --budget-s" in said, said
    assert list(tmp_path.iterdir()) == []


def test_a_profile_the_device_cannot_hold_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """Found fuzzing (2026-12-05): --scale full on a 23 GiB CPU was killed by the OOM killer (exit
    137, nothing said). The lower bound counts qwen3-8b's float32 weights (8.2 B parameters, over
    30 GiB) and the static K/V cache; a machine reporting less free is refused by name."""
    from trtspec.bench import synthetic

    full = synthetic._Profile(synthetic.resolve_model("qwen3-8b"),
                              SyntheticSettings(batches=[1], contexts=[64, 128]), torch.device("cpu"))
    assert full.need_bytes() > 30 * 2**30
    # float32 on the CPU: K/V of 2 * 8 kv heads * 128 * 4 bytes a layer, 294,912 bytes a token over
    # the target's 36 layers, 40,960 over the drafter's 5; the static cache holds batch 1 at 128 + 64
    # positions (the longest context and new-token run), the drafter's context batch 8 at 128
    weights = 4 * (full.arch.total_params() + full.draft_arch.total_params())
    assert full.need_bytes() == weights + 1 * 192 * 294_912 + 8 * 128 * 40_960
    small = synthetic._Profile(synthetic.resolve_model("qwen3-8b"), SyntheticSettings.small(),
                               torch.device("cpu"))
    assert small.need_bytes() < 2**30
    monkeypatch.setattr(synthetic, "free_bytes", lambda device: 2**30)  # a machine with 1 GiB free
    out = tmp_path / "s.json"
    args = ["--synthetic", "qwen3-8b", "--scale", "full", "--device", "cpu", "--batch-sizes", "1",
            "--contexts", "64", "--out", str(out)]
    run = CliRunner().invoke(main, ["profile", *args])
    said = " ".join(run.output.split())
    assert run.exit_code == 1 and "qwen3-8b at scale full needs at least" in said, said
    assert "1.0 GiB free" in said
    assert "use --scale small" in said and list(tmp_path.iterdir()) == []


def test_progress_times_and_rows_say_what_was_run(tiny_loop_overhead):
    """Each progress report counts the measurements left down to 0, its elapsed seconds grow from 0
    within the budget, and model creation is a part of them; cuda_graphs off is a GPU switch: the
    CPU still times the serving target's padded step (eager). llama3.1-8b's block of 10 verifies
    k = 9 drafts in the plugin rows."""
    elapsed: list[float] = []
    left: list[str] = []  # "N measurement(s) not run yet", counting down to 0

    def progress(partial: dict) -> None:
        elapsed.append(partial["elapsed_s"])
        left.append(partial["partial"])

    settings = SyntheticSettings.small(new_tokens=[1], cuda_graphs=False)
    result = profile_synthetic("llama3.1-8b", settings, "cpu", loop_overhead=tiny_loop_overhead,
                               on_progress=progress)
    assert len(elapsed) > 1 and elapsed == sorted(elapsed) and 0 < elapsed[0]
    assert [int(said.split()[0]) for said in left] == list(range(len(left) - 1, -1, -1))
    assert elapsed[-1] <= result["elapsed_s"] <= settings.budget_s
    assert 0 < result["create_s"] < elapsed[0]
    assert all(r["padded"] == "eager" and r["padded_ms"] > 0 for r in result["serving"])
    verify = [r["shape"] for r in result["plugins"] if r["kernel"] != "kv_injection_attention"]
    assert verify and all(" k9 " in shape for shape in verify)
