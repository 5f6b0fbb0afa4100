"""DSpark: Markov head, confidence head, STS, DeepSpec checkpoint layout, training == inference."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import save_file

from trtspec.errors import CheckpointError
from trtspec.models.dspark import DSparkDraftModel, load_dspark, save_dspark
from trtspec.models.dspark_drafter import DSparkDrafter
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.spec.sampling import SamplingParams, probs_from_logits
from trtspec.spec.sts import (
    DEFAULT_GRID,
    STSCalibration,
    confidences,
    expected_calibration_error,
    fit_sts,
    load_sts,
    save_sts,
    survival_ece,
)
from trtspec.train.dspark import DSparkTrainConfig, block_forward, dspark_loss, new_dspark
from trtspec.trtllm.fields import DSPARK_DRAFT_KEYS

from .conftest import REPO, draft_rows, with_slots

GAMMA = 5


@pytest.fixture(scope="module")
def target(random_qwen3_dir):
    return load_causal_lm(random_qwen3_dir)


@pytest.fixture(scope="module")
def drafter_model(target) -> DSparkDraftModel:
    torch.manual_seed(0)
    cfg = DSparkTrainConfig(block_size=GAMMA, num_layers=2, target_layer_ids=[0, 2], markov_rank=16,
                            init_from_target=False)
    model = new_dspark(target, mask_token_id=258, cfg=cfg)
    with torch.no_grad():  # W2 starts at 0 and norms at 1: move them so a mix-up would show
        model.markov_head.markov_w2.weight.normal_(0, 0.3)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def _taps(target, ids, layer_ids):
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return torch.cat([hs[i + 1] for i in layer_ids], -1)


def _drafter(target, model, ids, sts=None) -> DSparkDrafter:
    """A drafter that has absorbed the context ids[:-1]; the anchor is ids[-1]."""
    d = with_slots(DSparkDrafter(model, sts_temperatures=sts))
    d.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1], model.spec.target_layer_ids)[0])
    return d


def _ids(seed: int, n: int = 20) -> torch.Tensor:
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def _propose(drafter, ids, sampling, seed=7):
    return drafter.propose(draft_rows(ids[0].tolist(), sampling=sampling, seed=seed), GAMMA)


SAMPLED = SamplingParams(temperature=0.8, top_k=50)


def test_markov_head_with_zero_w2_is_the_backbone(target, drafter_model):
    ids = _ids(1)
    plain = copy.deepcopy(drafter_model)
    with torch.no_grad():
        plain.markov_head.markov_w2.weight.zero_()
    d = _drafter(target, plain, ids)
    with torch.no_grad():
        backbone = plain.lm_head(d.backbone_hidden(draft_rows(ids[0].tolist()), GAMMA))  # [1, γ, V]
    greedy = _propose(d, ids, SamplingParams())
    assert torch.equal(greedy.tokens, backbone.argmax(-1))
    d = _drafter(target, plain, ids)
    sampled = _propose(d, ids, SAMPLED)
    torch.testing.assert_close(sampled.q_probs, probs_from_logits(backbone, SAMPLED))
    # with W2 ≠ 0 every slot moves, the first one too (it is conditioned on x_0 = the anchor)
    markov = _propose(_drafter(target, drafter_model, ids), ids, SAMPLED)
    assert (markov.q_probs - sampled.q_probs).abs().amax(-1).min() > 1e-3


def test_markov_head_conditions_on_the_previous_draft(target, drafter_model):
    """q_k depends on x_{k−1} exactly through W2·W1[x_{k−1}]."""
    ids = _ids(2)
    d = _drafter(target, drafter_model, ids)
    prop = _propose(d, ids, SAMPLED)
    with torch.no_grad():
        base = drafter_model.lm_head(d.backbone_hidden(draft_rows(ids[0].tolist()), GAMMA))  # [1, γ, V]
        prev = torch.cat([ids[:, -1:], prop.tokens[:, :-1]], 1)  # x_0..x_{γ−1}
        expected = base + drafter_model.markov_head.markov_w2(drafter_model.markov_head.markov_w1(prev))
    torch.testing.assert_close(prop.q_probs, probs_from_logits(expected, SAMPLED))


def test_sts_keeps_rankings_within_each_slot():
    gen = torch.Generator().manual_seed(0)
    z = 2 * torch.randn(500, GAMMA, generator=gen, dtype=torch.float64)
    temps = torch.tensor([0.5, 1.0, 2.5, 7.0, 0.8], dtype=torch.float64)
    calibrated = confidences(z, temps)
    for j in range(GAMMA):
        assert torch.equal(torch.argsort(calibrated[:, j]), torch.argsort(z[:, j]))
        # float32 may saturate to ties but never reorders
        by_z = confidences(z.float(), temps.float())[torch.argsort(z[:, j]), j]
        assert (by_z[1:] >= by_z[:-1]).all()
    assert not torch.allclose(calibrated, torch.sigmoid(z))


def test_ece_of_known_cases():
    pred = torch.tensor([0.05, 0.15, 0.95, 0.95])
    # bins 0, 1, 9: gaps 0.05 + 0.15 + |1.9 − 2| over 4 predictions
    assert expected_calibration_error(pred, torch.tensor([0, 0, 1, 1]), bins=10) == pytest.approx(0.075)
    assert expected_calibration_error(torch.full((4,), 0.5), torch.tensor([1, 1, 1, 1])) == pytest.approx(0.5)


@pytest.mark.parametrize("pred, outcome, ece", [
    ([0.3], [1], 0.7),  # one prediction is a bin of its own
    ([0.05, 0.15], [1, 0], 0.55),  # bins 0 and 1 apart: |0.05 - 1| + |0.15 - 0| over 2
    ([0.85, 0.95], [1, 0], 0.55),  # bins 8 and 9 apart
    ([0.95, 1.0], [1, 0], 0.475),  # a prediction of 1 is in the last bin: |0.95 + 1 - 1| over 2
], ids=["one", "first-bins", "last-bins", "one-is-last"])
def test_ece_bins_split_at_each_tenth_and_keep_1_in_the_last(pred, outcome, ece):
    """Equal-width bins: [0, 0.1) is the first, [0.9, 1] the last (1.0 itself included); gaps of
    opposite signs cancel within a bin only."""
    got = expected_calibration_error(torch.tensor(pred), torch.tensor(outcome), bins=10)
    assert got == pytest.approx(ece)


def test_sts_grid_spans_0_01_to_10_with_1_in_it():
    """fit_sts searches 121 temperatures, log-spaced from 0.01 to 10, T = 1 (no change) one of them."""
    assert len(DEFAULT_GRID) == 121 and 1.0 in DEFAULT_GRID
    assert (DEFAULT_GRID[0], DEFAULT_GRID[-1]) == (pytest.approx(0.01), pytest.approx(10.0))


def test_sts_recovers_overconfident_slots():
    """Outcomes drawn with c_j = σ(z_j / 2.5): STS finds T ≈ 2.5 and shrinks the ECE."""
    gen = torch.Generator().manual_seed(1)
    z = 2 * torch.randn(20000, GAMMA, generator=gen) + 1
    accepted = torch.rand(z.shape, generator=gen) < torch.sigmoid(z / 2.5)
    survived = accepted.int().cumprod(-1).bool()
    temps = fit_sts(z, survived)
    assert torch.allclose(temps, torch.full((GAMMA,), 2.5), rtol=0.25), temps
    before, after = survival_ece(z, survived, None), survival_ece(z, survived, temps)
    assert max(after) < 0.02 < min(before), (before, after)


def test_save_load_identical_outputs(tmp_path, target, drafter_model):
    save_dspark(drafter_model, tmp_path)
    loaded = load_dspark(tmp_path, target.config)
    ids = _ids(3)
    for sampling in (SamplingParams(), SAMPLED):
        a = _propose(_drafter(target, drafter_model, ids), ids, sampling)
        b = _propose(_drafter(target, loaded, ids), ids, sampling)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.confidence, b.confidence)
        assert (a.q_probs is None and b.q_probs is None) or torch.equal(a.q_probs, b.q_probs)


@pytest.mark.parametrize("body,said", [
    # NaN passed the check (min() <= 0 is false) and made every confidence NaN; the string "1" and
    # true were read as 1.0
    ({"temperatures": [float("nan"), 1, 1, 1, 1]}, "temperatures must be numbers > 0, got nan"),
    ({"temperatures": [1, 1, float("inf"), 1, 1]}, "temperatures must be numbers > 0, got inf"),
    ({"temperatures": [1, 1, 1, 0, 1]}, "temperatures must be numbers > 0, got 0"),
    ({"temperatures": [1, "1", 1, 1, 1]}, "temperatures.1: Input should be a valid number, got .1."),
    ({"temperatures": [True, 1, 1, 1, 1]}, "temperatures.0: Input should be a valid number, got True"),
    ({"temperatures": "abc"}, "sts.json: temperatures: Input should be a valid list, got 'abc'"),
    ([1, 1, 1, 1, 1], r"sts.json: Input should be a valid dictionary .*, got \[1, 1, 1, 1, 1\]"),
    # a missing field's pydantic input is the whole file: not quoted
    ({"mode": "greedy", "source": "x" * 300}, r"sts.json: temperatures: Field required; rerun"),
])
def test_an_sts_json_of_wrong_values_is_refused_naming_the_field(tmp_path, body, said):
    (tmp_path / "sts.json").write_text(json.dumps(body))
    with pytest.raises(CheckpointError, match=said):
        load_sts(tmp_path, GAMMA)


def test_stored_sts_temperatures_reach_the_proposal(tmp_path, target, drafter_model, random_qwen3_dir):
    from trtspec.config import DrafterConfig
    from trtspec.models.drafter import build_drafter

    save_dspark(drafter_model, tmp_path)
    temps = [0.5, 1.0, 2.0, 3.0, 4.0]
    save_sts(STSCalibration(temperatures=temps), tmp_path)
    assert torch.equal(load_sts(tmp_path, GAMMA), torch.tensor(temps))
    drafter = build_drafter(DrafterConfig(method="dspark", path=str(tmp_path)), TargetModel(target))
    ids = _ids(4)
    with_slots(drafter).begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1], drafter.tap_layer_ids)[0])
    calibrated = _propose(drafter, ids, SamplingParams())
    raw = _propose(_drafter(target, drafter_model, ids), ids, SamplingParams())
    assert torch.equal(calibrated.tokens, raw.tokens)
    logits = torch.logit(raw.confidence.double())
    torch.testing.assert_close(calibrated.confidence.double(), torch.sigmoid(logits / torch.tensor(temps)),
                               atol=1e-5, rtol=1e-4)
    save_sts(STSCalibration(temperatures=temps[:3]), tmp_path)
    with pytest.raises(CheckpointError, match="temperatures has 3 values .* block_size is 5"):
        load_sts(tmp_path, GAMMA)


def _published_checkpoint(path, rank=8):
    """A minimal writer of DeepSpec's layout (names from deepspec/modeling/dspark, config fields
    from `build_draft_config`), independent of trtspec's writer."""
    h, inter, d, heads, kv, vocab = 64, 96, 16, 4, 2, 264
    gen = torch.Generator().manual_seed(5)
    tensors = {"fc.weight": torch.randn(h, 2 * h, generator=gen), "hidden_norm.weight": torch.ones(h),
               "norm.weight": torch.ones(h), "embed_tokens.weight": torch.randn(vocab, h, generator=gen),
               "lm_head.weight": torch.randn(vocab, h, generator=gen),
               "markov_head.markov_w1.weight": torch.randn(vocab, rank, generator=gen),
               "markov_head.markov_w2.weight": torch.randn(vocab, rank, generator=gen),
               "confidence_head.proj.weight": torch.randn(1, h + rank, generator=gen),
               "confidence_head.proj.bias": torch.randn(1, generator=gen)}
    shapes = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
              "self_attn.q_proj.weight": (heads * d, h), "self_attn.k_proj.weight": (kv * d, h),
              "self_attn.v_proj.weight": (kv * d, h), "self_attn.o_proj.weight": (h, heads * d),
              "self_attn.q_norm.weight": (d,), "self_attn.k_norm.weight": (d,),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h),
              "mlp.down_proj.weight": (h, inter)}
    for name, shape in shapes.items():
        tensors[f"layers.0.{name}"] = torch.randn(*shape, generator=gen)
    save_file(tensors, str(path / "model.safetensors"))
    config = {
        "architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "block_size": 7,
        "mask_token_id": 258, "target_layer_ids": [0, 2], "num_target_layers": 3, "num_anchors": 512,
        "markov_rank": rank, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "layer_types": ["full_attention"],
        "num_hidden_layers": 1, "hidden_size": h, "intermediate_size": inter,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d, "vocab_size": vocab,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "max_position_embeddings": 512,
        "hidden_act": "silu", "tie_word_embeddings": False,
    }
    (path / "config.json").write_text(json.dumps(config))
    return tensors, config


def test_published_layout_written_by_hand_loads(tmp_path, target):
    tensors, _ = _published_checkpoint(tmp_path)
    model = load_dspark(tmp_path, target.config)
    assert model.spec.block_size == 7 and model.spec.target_layer_ids == [0, 2]
    assert model.spec.markov_rank == 8 and model.spec.confidence_head_with_markov
    state = model.state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(state[name], tensor), name
    out = tmp_path / "resaved"
    save_dspark(model, out)
    resaved = json.loads((out / "config.json").read_text())
    published = json.loads((tmp_path / "config.json").read_text())
    for field in ("architectures", "block_size", "mask_token_id", "target_layer_ids", "num_target_layers",
                  "num_anchors", "markov_rank", "markov_head_type", "enable_confidence_head",
                  "confidence_head_with_markov", "layer_types", "tie_word_embeddings"):
        assert resaved[field] == published[field], field
    reloaded = load_dspark(out, target.config).state_dict()
    assert all(torch.equal(reloaded[name], tensor) for name, tensor in tensors.items())


@pytest.mark.parametrize("field", ["enable_confidence_head", "confidence_head_with_markov"])
def test_a_confidence_flag_that_is_not_true_or_false_is_named(tmp_path, target, field):
    """bool("false") is True: the string loaded as an enabled head (or, on a checkpoint without
    one, failed blaming its weights)."""
    _, config = _published_checkpoint(tmp_path)
    config[field] = "false"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=rf"config.json: {field} must be true or false, got 'false'"):
        load_dspark(tmp_path, target.config)


def _respelled(config: dict, spelling: str) -> dict:
    """`config` with its DSpark fields moved to another exporter's spelling."""
    moved = {key: config.pop(key) for key in ("block_size", "mask_token_id", "target_layer_ids",
                                              "markov_rank", "markov_head_type")}
    moved["markov_head_type"] = "Vanilla"  # sglang and TensorRT-LLM lower-case it
    if spelling == "prefixed":  # DeepSeek-V4-Flash-DSpark, sglang
        config.update({DSPARK_DRAFT_KEYS[key]: value for key, value in moved.items()})
    else:  # SpecForge nests them in dflash_config; TensorRT-LLM also reads dspark_config
        config[spelling] = moved
    return config


@pytest.mark.parametrize("spelling", ["prefixed", "dflash_config", "dspark_config"])
def test_every_published_spelling_loads_the_same_drafter(tmp_path, target, spelling):
    tensors, config = _published_checkpoint(tmp_path)
    plain = load_dspark(tmp_path, target.config)
    (tmp_path / "config.json").write_text(json.dumps(_respelled(config, spelling)))
    model = load_dspark(tmp_path, target.config)
    assert model.spec == plain.spec
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in tensors.items())


@pytest.mark.parametrize("value", ["block_size: 7", 7, [7]])
@pytest.mark.parametrize("section", ["dflash_config", "dspark_config"])
def test_a_section_that_is_no_object_is_refused(tmp_path, target, section, value):
    """Passed over unread: the drafter loaded from the top-level fields whatever the section said."""
    _, config = _published_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, section: value}))
    with pytest.raises(CheckpointError, match=f"{section} must be an object of DSpark fields, got "):
        load_dspark(tmp_path, target.config)


def test_spellings_that_disagree_are_refused(tmp_path, target):
    _, config = _published_checkpoint(tmp_path)
    config["dspark_block_size"] = 5  # beside block_size 7
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"dspark_block_size = 5 and block_size = 7"):
        load_dspark(tmp_path, target.config)


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda c: c.update(hidden_size=32, head_dim=8), "hidden_size is 32 but the target has 64"),
        (lambda c: c.update(vocab_size=300), "vocab_size is 300 but the target has 264"),
        (lambda c: c.update(num_target_layers=5), "num_target_layers is 5 but the target has 3"),
        (lambda c: c.update(target_layer_ids=[0, 3]), r"target_layer_ids \[0, 3\] has \[3\]"),
        (lambda c: c.update(mask_token_id=264), "mask_token_id 264 is outside"),
        (lambda c: c.update(markov_head_type="gated"), "needs tensor markov_head.gate_proj.weight, absent"),
        (lambda c: c.update(architectures=["DFlashDraftModel"]), "architectures is"),
        (lambda c: c.pop("markov_rank"), "missing DSpark field 'markov_rank'"),
        (lambda c: c.update(mask_token_id=None), "mask_token_id must be an integer, got None"),
        (lambda c: c.update(block_size="7"), "block_size must be an integer, got '7'"),
        (lambda c: c.update(target_layer_ids=[0, None]), r"target_layer_ids must be a list of layer indices"),
        (lambda c: c.update(markov_rank=4), "weights do not match"),
        # taken as they were: the drafts (and confidences) came out NaN
        (lambda c: c.update(rms_norm_eps=float("nan")), "rms_norm_eps must be a finite number >= 0, got nan"),
    ],
)
def test_misfits_refused(tmp_path, target, edit, message):
    _, config = _published_checkpoint(tmp_path)
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message):
        load_dspark(tmp_path, target.config)


def test_training_forward_equals_inference_at_each_anchor(target, drafter_model):
    """The packed, teacher-forced training view gives each anchor's inference logits and
    confidences when the drafts equal the target's tokens."""
    seq = _ids(6, 40)
    taps = _taps(target, seq, drafter_model.spec.target_layer_ids)
    anchors = torch.tensor([[7, 19, 30]])
    with torch.no_grad():
        batch = block_forward(drafter_model, seq, taps, anchors)
        logits, conf = drafter_model.teacher_forced(batch.hidden, batch.prev)
    for j, a in enumerate(anchors[0].tolist()):
        d = _drafter(target, drafter_model, seq[:, : a + 1])
        labels = seq[0, a + 1 : a + 1 + GAMMA]
        drafted = d.draft_block(draft_rows(seq[0, : a + 1].tolist()), GAMMA,
                                lambda k, _, forced=labels: forced[k : k + 1])
        torch.testing.assert_close(logits[0, j], drafted.logits[0], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(conf[0, j], drafted.confidence_logits[0], atol=1e-5, rtol=1e-4)
        assert torch.equal(batch.labels[0, j], labels)


def test_loss_terms_and_gradients(target, drafter_model):
    seq = _ids(8, 40)
    taps = _taps(target, seq, drafter_model.spec.target_layer_ids)
    model = copy.deepcopy(drafter_model).train()
    batch = block_forward(model, seq, taps, torch.tensor([[5, 20]]))
    with torch.no_grad():
        p_t = target(seq).logits[0, batch.positions[0]][None]  # [1, n, γ, V]
    loss, metrics = dspark_loss(model, batch, p_t, DSparkTrainConfig(block_size=GAMMA))
    loss.backward()
    assert loss.item() > 0 and 1 <= metrics["tau_prob"] <= 1 + GAMMA
    for name in ("markov_head.markov_w1.weight", "markov_head.markov_w2.weight",
                 "confidence_head.proj.weight", "fc.weight"):
        assert model.get_parameter(name).grad.abs().sum() > 0, name
    assert model.lm_head.weight.grad is None and model.embed_tokens.weight.grad is None
    # the drafter's own distribution as p_t: TV = 0, so c* = 1 and only CE and BCE remain
    with torch.no_grad():
        own, _ = model.teacher_forced(batch.hidden, batch.prev)
    _, same = dspark_loss(model, batch, own, DSparkTrainConfig(block_size=GAMMA))
    assert same["tau_prob"] == pytest.approx(1 + GAMMA, abs=1e-4)


def test_labels_past_the_response_s_end_carry_no_weight(target, drafter_model):
    """A block running past the valid length is trained on the slots before it: tokens and target
    logits past the end change nothing, and a block whose every label exists loses what it did."""
    seq = _ids(9, 40)
    taps = _taps(target, seq, drafter_model.spec.target_layer_ids)
    with torch.no_grad():
        logits = target(seq).logits[0]  # [40, V]
    cfg, end = DSparkTrainConfig(block_size=GAMMA), torch.tensor([30])

    def loss_of(tokens, anchors, lens, p_logits=logits):
        with torch.no_grad():
            batch = block_forward(drafter_model, tokens, taps, torch.tensor([anchors]), lens)
            p_t = p_logits[batch.positions[0].clamp(max=39)][None]  # [1, n, γ, V]
            return dspark_loss(drafter_model, batch, p_t, cfg)

    whole = [3, 12, 30 - 1 - GAMMA]
    assert loss_of(seq, whole, end)[0].item() == pytest.approx(loss_of(seq, whole, None)[0].item(), rel=1e-6)
    past = [3, 30 - GAMMA, 28]  # the last two run past the end
    padded, noisy = seq.clone(), logits.clone()
    padded[0, 30:] = 256
    noisy[29:] += torch.randn(noisy[29:].shape, generator=torch.Generator().manual_seed(5))  # p_t of x_30..
    loss, metrics = loss_of(seq, past, end)
    again, metrics_again = loss_of(padded, past, end, noisy)
    assert again.item() == pytest.approx(loss.item(), rel=1e-6)
    assert metrics_again["tau_prob"] == pytest.approx(metrics["tau_prob"], rel=1e-6)
    assert torch.equal(metrics["acc"], metrics_again["acc"])


def test_greedy_lossless_with_untrained_drafter(target, drafter_model, tmp_path):
    from trtspec.spec.decoder import SpeculativeDecoder

    save_dspark(drafter_model, tmp_path)
    model = load_dspark(tmp_path, target.config)
    tgt = TargetModel(target, tuple(model.spec.target_layer_ids))
    spec = SpeculativeDecoder(tgt, DSparkDrafter(model), end_ids=(256,))
    plain = SpeculativeDecoder(TargetModel(target), None, end_ids=(256,))
    for seed in range(3):
        ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(seed)).tolist()
        assert spec.generate(ids, 50).token_ids == plain.generate(ids, 50).token_ids


def test_a_checkpoint_without_confidence_head_schedules_like_a_plain_drafter(target, tmp_path):
    """DeepSpec's DFlash recipe writes Qwen3DSparkModel with markov_rank 0 and
    enable_confidence_head false. Its proposals carry no confidences, so adaptive speculation must
    not draft whole blocks for Algorithm 1 to cut: a probe drafts PROBE_LEN (it drafted all 8)."""
    from trtspec.config import ScheduleConfig
    from trtspec.spec.decoder import PROBE_LEN, SpeculativeDecoder
    from trtspec.spec.schedule import SPSTable

    torch.manual_seed(0)
    cfg = DSparkTrainConfig(block_size=8, num_layers=1, target_layer_ids=[0, 2], markov_rank=0,
                            confidence_alpha=0.0, init_from_target=False)
    save_dspark(new_dspark(target, mask_token_id=258, cfg=cfg), tmp_path)
    model = load_dspark(tmp_path, target.config)
    drafter = DSparkDrafter(model)
    assert model.confidence_head is None and not drafter.has_confidence
    table = SPSTable(batch_tokens=[1, 8, 16], steps_per_s=[100.0, 95.0, 80.0], draft_batches=[1, 8],
                     draft_lens=[1, 15], draft_seconds=[[0.003, 0.004], [0.004, 0.006]])
    decoder = SpeculativeDecoder(TargetModel(target, tuple(model.spec.target_layer_ids)), drafter, (256,),
                                 schedule=ScheduleConfig(mode="adaptive"), cost_table=table, max_slots=1,
                                 capacity=256)
    drafted = decoder.generate(_ids(3, 12)[0].tolist(), 60).drafted_counts
    assert PROBE_LEN in drafted and 8 not in drafted


def test_adaptive_calibration_holds_the_verdicts_against_what_algorithm_1_let_through():
    """Adaptive speculation plans a DSpark step over the whole block, and Algorithm 1 then cuts each
    row from its confidences; the gain calibration held the cut step's verdicts against the gains
    expected of the whole block (about 3 drafts expected of one verified and rejected), so after an
    unlucky first step the estimates fell and drafting stayed off (the demo prompt: τ 1.97, 351
    tok/s, against 6.32 in scheduler mode). Now each observation expects at most the drafts verified."""
    from trtspec.config import load_build_config
    from trtspec.pipeline import load_pipeline
    from trtspec.spec.schedule import SPSTable

    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dspark.yaml"))
    # about this CPU's: a plain step 8 ms, verifying a block 1.8 times that, a block drafted in 4.5 ms
    table = SPSTable(batch_tokens=[1, 8, 16], steps_per_s=[125.0, 90.0, 70.0], draft_batches=[1],
                     draft_lens=[15], draft_seconds=[[0.0045]])
    decoder = pipeline.decoder_for(1, cost_table=table)
    assert decoder.schedule.mode == "adaptive" and decoder.drafter.has_confidence
    steps = []  # (drafts the calibration was told to expect accepted, drafts verified) per step
    observe, calibrate = decoder.calibration.observe, decoder._calibrate

    def spy(plan, running, accepted):
        decoder.calibration.observe = lambda expected, got: (steps.append((expected, sum(plan.depths))),
                                                             observe(expected, got))
        calibrate(plan, running, accepted)

    decoder._calibrate = spy
    result = decoder.generate(pipeline.tokenizer.encode("Q: 482 + 356\nA:"), 120)
    assert any(v < 15 for _, v in steps), steps  # Algorithm 1 cut some blocks
    assert all(e <= v for e, v in steps), steps
    assert result.tau > 4, result.tau  # greedy, the cost table given: drafting was not switched off


def test_a_build_takes_at_most_gamma_drafts(tmp_path, target, drafter_model):
    """`drafter.num_draft_tokens` up to γ (or unset: γ) builds; γ + 1 is refused by name."""
    from trtspec.config import DrafterConfig
    from trtspec.models.drafter import build_drafter

    save_dspark(drafter_model, tmp_path)
    tgt = TargetModel(target, tuple(drafter_model.spec.target_layer_ids))
    for k, want in ((None, GAMMA), (GAMMA, GAMMA), (1, 1)):
        built = build_drafter(DrafterConfig(method="dspark", path=str(tmp_path), num_draft_tokens=k), tgt)
        assert isinstance(built, DSparkDrafter) and built.num_draft_tokens == want
    with pytest.raises(CheckpointError, match="is 6 but the DSpark block size 5 yields at most 5 drafts"):
        build_drafter(DrafterConfig(method="dspark", path=str(tmp_path), num_draft_tokens=GAMMA + 1), tgt)


def test_tree_scores_are_path_survivals_under_the_stored_sts_temperatures(target, drafter_model):
    """A tree grows from survival scores: log c (σ(z / T_d), T_d the STS temperature of the node's
    slot) + log q − max log q, written here from the heads' own outputs: the same tree."""
    from trtspec.config import TreeConfig
    from trtspec.spec.tree import grow_tree

    temps = torch.tensor([0.5, 1.0, 2.0, 3.0, 4.0])
    ids = _ids(31)
    d = _drafter(target, drafter_model, ids, sts=temps)
    assert d.graphed is None and d.projections is None  # no cuda_graphs asked: no padded steps
    rows = draft_rows(ids[0].tolist())
    tree = d.propose_tree(rows, TreeConfig(nodes=12, topk=3, depth=4))
    heads = d.tree_heads(rows, 4)

    def survival(depth, prev, parent=None):  # a memoryless head: no state to carry
        logits, conf, _ = heads(depth, prev, None)
        logq = torch.log_softmax(logits.float(), -1)
        return torch.sigmoid(conf / temps[depth]).log()[..., None] + logq - logq.amax(-1, keepdim=True)

    want = grow_tree(survival(0, ids[:, -1:])[:, 0], survival, 3, 12, 4)
    assert torch.equal(tree.tokens, want.tokens) and torch.equal(tree.parents, want.parents)


def test_greedy_outcomes_draft_at_every_anchor_and_survive_up_to_the_first_miss(target, drafter_model):
    """`calibrate`'s outcomes: one row per anchor a of prompt_len − 1 ≤ a < len − γ (a row shorter
    than that gives none), owned by its prompt; the logits are the drafted block's confidence logits
    and slot j survives iff slots 1..j all equal the continuation. Row 0's continuation is the
    drafter's own greedy block from its one anchor with slot 3 changed: it survives two slots."""
    from trtspec.train.calibrate import greedy_outcomes
    from trtspec.train.dflash import target_taps

    layer_ids, vocab = drafter_model.spec.target_layer_ids, target.config.vocab_size
    seqs = torch.cat([_ids(41, 16), _ids(42, 16), _ids(43, 16)])
    prompt_lens, lens = torch.tensor([6, 4, 9]), torch.tensor([6 + GAMMA, 16, 9 + GAMMA - 1])
    with torch.inference_mode():
        one = block_forward(drafter_model, seqs[:1], target_taps(target, seqs[:1], layer_ids),
                            torch.tensor([[5]]))
        block = drafter_model.decode_block(one.hidden[0], one.prev[0, :, 0], lambda _, z: z.argmax(-1))
    seqs[0, 6 : 6 + GAMMA] = block.tokens[0]
    seqs[0, 8] = (seqs[0, 8] + 1) % vocab
    taps = target_taps(target, seqs, layer_ids)
    out = greedy_outcomes(drafter_model, seqs, lens, prompt_lens, taps)
    assert out.prompt_index.tolist() == [0] + [1] * (16 - GAMMA - 3)  # row 2: no anchor
    assert out.logits.shape == out.survived.shape == (1 + 16 - GAMMA - 3, GAMMA)
    assert out.survived[0].tolist() == [True, True, False, False, False]
    torch.testing.assert_close(out.logits[0], block.confidence_logits[0])
    assert torch.equal(out.survived, out.survived.int().cummin(-1).values.bool())  # a prefix survives
    chunked = greedy_outcomes(drafter_model, seqs, lens, prompt_lens, taps, chunk=3)
    for got, want in zip((chunked.logits, chunked.survived, chunked.prompt_index),
                         (out.logits, out.survived, out.prompt_index), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # batched: float rounding


def test_pooled_ece_is_the_mean_over_slots_and_zero_for_none():
    from trtspec.train.calibrate import pooled_ece

    def cal(before, after):
        return STSCalibration(temperatures=[1.0] * len(before), ece_before=before, ece_after=after)

    assert pooled_ece(cal([0.25], [0.5])) == (0.25, 0.5)
    assert pooled_ece(cal([0.25, 0.5, 0.75], [0.0, 0.25, 0.5])) == (0.5, 0.25)
    assert pooled_ece(cal([], [])) == (0.0, 0.0)


def test_calibrate_fits_on_the_even_prompts_and_reports_ece_on_the_odd(tmp_path):
    """The shipped drafter on the math prompts (16 tokens each: 2 anchors a prompt at γ = 15): the
    temperatures are fit_sts of the even prompts' outcomes, the ECE is the odd ones', the source
    counts both halves, and sts.json holds what was returned."""
    import shutil
    from pathlib import Path

    from trtspec.config import ASSETS_DIR
    from trtspec.prompts import load_prompts
    from trtspec.train.calibrate import calibrate, greedy_outcomes
    from trtspec.train.dflash import target_taps
    from trtspec.train.prompts import encode_prompts, regenerate

    drafter_dir = shutil.copytree(ASSETS_DIR / "tiny-dspark-b15", tmp_path / "dspark")
    target_dir = ASSETS_DIR / "tiny-target"
    cal = calibrate(drafter_dir, target_dir, ["math"], response_tokens=16, bins=5)
    assert load_sts(drafter_dir, 15).tolist() == pytest.approx(cal.temperatures)
    target = load_causal_lm(target_dir)
    model = load_dspark(drafter_dir, target.config)
    prompts, end_ids = encode_prompts(target_dir, target.config, load_prompts("math"), Path("math"))
    seqs, lens = regenerate(target, prompts, 16, end_ids)
    taps = target_taps(target, seqs, model.spec.target_layer_ids)
    out = greedy_outcomes(model, seqs, lens, torch.tensor([len(p) for p in prompts]), taps)
    even = torch.tensor([i % 2 == 0 for i in out.prompt_index.tolist()])
    assert 0 < even.sum() < len(even)
    fit, held = (out.logits[even], out.survived[even]), (out.logits[~even], out.survived[~even])
    assert cal.temperatures == [round(float(t), 4) for t in fit_sts(*fit, bins=5)]
    assert cal.ece_before == [round(e, 4) for e in survival_ece(*held, None, 5)]
    assert (cal.mode, cal.bins, len(cal.ece_after)) == ("greedy", 5, 15)
    assert cal.source == (f"tasks math: {len(prompts)} prompts, {len(even)} anchors; fit on even prompts "
                          f"({int(even.sum())} anchors), ECE on odd ({int((~even).sum())})")
