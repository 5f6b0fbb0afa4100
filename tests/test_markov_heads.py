"""DSpark's gated and RNN Markov heads (DeepSpec `markov_head_type` "gated" / "rnn"): DeepSpec's
checkpoint layout, the heads' formulas teacher-forced and unrolled, lossless chains and trees,
training, save/load, and the exported heads graph under onnxruntime."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from trtspec.config import TreeConfig
from trtspec.errors import CheckpointError
from trtspec.models.dspark import DSparkDraftModel, load_dspark, save_dspark
from trtspec.models.dspark_drafter import DSparkDrafter
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.spec.sampling import SamplingParams, probs_from_logits
from trtspec.train.dspark import DSparkTrainConfig, block_forward, dspark_loss, new_dspark

from .conftest import draft_rows, with_slots
from .test_dspark import _published_checkpoint, _taps

GAMMA = 5
HEADS = ("gated", "rnn")
SAMPLED = SamplingParams(temperature=0.8, top_k=50)


@pytest.fixture(scope="module")
def target(random_qwen3_dir):
    return load_causal_lm(random_qwen3_dir)


def _random_model(target, head_type: str, seed: int = 0) -> DSparkDraftModel:
    """A trtspec-built drafter with every head tensor moved off its initialisation (W2 starts at 0)."""
    torch.manual_seed(seed)
    cfg = DSparkTrainConfig(block_size=GAMMA, num_layers=1, target_layer_ids=[0, 2], markov_rank=16,
                            markov_head_type=head_type, init_from_target=False)
    model = new_dspark(target, mask_token_id=258, cfg=cfg)
    with torch.no_grad():
        for name, p in model.markov_head.named_parameters():
            p.normal_(0, 1.0 if "markov_w" in name else 0.5)
    assert model.markov_head.head_type == head_type
    return model.eval()


@pytest.fixture(scope="module", params=HEADS)
def model(request, target) -> DSparkDraftModel:
    return _random_model(target, request.param)


def _head_tensors(rank: int, head_type: str, h: int = 64, seed: int = 11) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    if head_type == "gated":
        return {"markov_head.gate_proj.weight": torch.randn(rank, h + rank, generator=gen),
                "markov_head.gate_proj.bias": torch.randn(rank, generator=gen)}
    return {"markov_head.joint_proj.weight": 0.5 * torch.randn(3 * rank, 2 * rank + h, generator=gen),
            "markov_head.joint_proj.bias": torch.randn(3 * rank, generator=gen)}


def _deepspec_checkpoint(path, head_type: str, rank: int = 8) -> dict[str, torch.Tensor]:
    """DeepSpec's layout with a gated or RNN head, written by hand (names from
    deepspec/modeling/dspark/markov_head.py: `gate_proj`, `joint_proj` under `markov_head.`)."""
    _published_checkpoint(path, rank)
    tensors = {**load_file(str(path / "model.safetensors")), **_head_tensors(rank, head_type)}
    save_file(tensors, str(path / "model.safetensors"))
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "markov_head_type": head_type}))
    return tensors


def _bias_by_formula(t: dict[str, torch.Tensor], head_type: str, prev: torch.Tensor, hidden: torch.Tensor,
                     state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """B_k and s_k written out from the raw tensors.  prev [b]; hidden [b, H]; state [b, r]"""
    e = t["markov_head.markov_w1.weight"][prev]  # [b, r]
    w2 = t["markov_head.markov_w2.weight"]  # [V, r]
    if head_type == "gated":
        gate = torch.sigmoid(torch.cat([hidden, e], -1) @ t["markov_head.gate_proj.weight"].T
                             + t["markov_head.gate_proj.bias"])
        return (gate * e) @ w2.T, state
    r = e.shape[-1]
    joint = t["markov_head.joint_proj.weight"], t["markov_head.joint_proj.bias"]
    y = torch.cat([state, e, hidden], -1) @ joint[0].T + joint[1]
    gate, candidate, out = torch.sigmoid(y[:, :r]), torch.tanh(y[:, r : 2 * r]), torch.tanh(y[:, 2 * r :])
    return out @ w2.T, gate * state + (1 - gate) * candidate


@pytest.mark.parametrize("head_type", HEADS)
def test_deepspec_layout_loads_and_block_logits_follow_the_formula(tmp_path, target, head_type):
    tensors = _deepspec_checkpoint(tmp_path, head_type)
    model = load_dspark(tmp_path, target.config)
    assert model.spec.markov_head_type == head_type and type(model.markov_head).head_type == head_type
    state = model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in tensors.items())
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(1))
    d = with_slots(DSparkDrafter(model))
    d.begin(0, ids[0, :-1].tolist(), _taps(target, ids[:, :-1], model.spec.target_layer_ids)[0])
    rows = draft_rows(ids[0].tolist())
    gamma = model.spec.block_size
    with torch.no_grad():
        hidden = d.backbone_hidden(rows, gamma)  # [1, γ, H]
        base = model.lm_head(hidden)  # [1, γ, V]
        forced = torch.randint(0, 256, (1, gamma), generator=torch.Generator().manual_seed(2))
        prev = torch.cat([ids[:, -1:], forced[:, :-1]], 1)  # x_0..x_{γ−1}
        teacher, _ = model.teacher_forced(hidden, prev)
        greedy = d.draft_block(rows, gamma, lambda _, z: z.argmax(-1))
    s_teacher = s_greedy = torch.zeros(1, 8)  # s_0 = 0 (used by the RNN head only)
    x = ids[:, -1]
    want_teacher, want_greedy, want_tokens = [], [], []
    for k in range(gamma):  # teacher-forced: x_{k−1} given; unrolled: x_{k−1} the previous argmax
        bias, s_teacher = _bias_by_formula(tensors, head_type, prev[:, k], hidden[:, k], s_teacher)
        want_teacher.append(base[:, k] + bias)
        bias, s_greedy = _bias_by_formula(tensors, head_type, x, hidden[:, k], s_greedy)
        want_greedy.append(base[:, k] + bias)
        x = want_greedy[-1].argmax(-1)
        want_tokens.append(x)
    torch.testing.assert_close(teacher, torch.stack(want_teacher, 1), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(greedy.logits, torch.stack(want_greedy, 1), atol=1e-4, rtol=1e-4)
    assert torch.equal(greedy.tokens, torch.stack(want_tokens, 1))
    assert not torch.allclose(teacher, base, atol=1e-2)  # the head moves the logits


def _prompts(n: int) -> list[list[int]]:
    return [torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(s)).tolist()
            for s in range(n)]


def test_greedy_chain_and_tree_decoding_equal_the_target_alone(tmp_path, target, model):
    from trtspec.spec.decoder import SpeculativeDecoder

    save_dspark(model, tmp_path)
    loaded = load_dspark(tmp_path, target.config)
    tgt = TargetModel(target, tuple(loaded.spec.target_layer_ids))
    plain = SpeculativeDecoder(TargetModel(target), None, end_ids=(256,))
    chain = SpeculativeDecoder(tgt, DSparkDrafter(loaded), end_ids=(256,))
    tree = SpeculativeDecoder(tgt, DSparkDrafter(loaded), end_ids=(256,), tree=TreeConfig(nodes=10, topk=3))
    for ids in _prompts(2):
        want = plain.generate(ids, 30).token_ids
        assert chain.generate(ids, 30).token_ids == want
        assert tree.generate(ids, 30).token_ids == want
    assert tree.offered_drafts > tree.num_cycles  # trees, not chains of one
    # sampled and seeded through the same loop: the same seed repeats the text, another moves it
    sampled = [chain.generate(_prompts(1)[0], 30, SAMPLED.model_copy(update={"seed": s})).token_ids
               for s in (3, 3, 4)]
    assert sampled[0] == sampled[1] != sampled[2]


def _drafter(target, model, ids) -> DSparkDrafter:
    d = with_slots(DSparkDrafter(model))
    d.begin(0, ids[:-1], _taps(target, torch.tensor([ids[:-1]]), model.spec.target_layer_ids)[0])
    return d


def test_sampled_proposals_are_reproducible_and_q_is_the_corrected_law(target, model):
    """A seeded sampled block repeats exactly, and each q_k is the law of the Markov-corrected
    logits on the drafts actually sampled before it (what the verifier's p/q test needs)."""
    ids = _prompts(3)[2]
    props = [_drafter(target, model, ids).propose(draft_rows(ids, sampling=SAMPLED, seed=5), GAMMA)
             for _ in range(2)]
    assert torch.equal(props[0].tokens, props[1].tokens) and torch.equal(props[0].q_probs, props[1].q_probs)
    d = _drafter(target, model, ids)
    forced = props[0].tokens[0]
    with torch.no_grad():
        drafted = d.draft_block(draft_rows(ids), GAMMA, lambda k, _: forced[k : k + 1])
    torch.testing.assert_close(props[0].q_probs, probs_from_logits(drafted.logits, SAMPLED))
    other = _drafter(target, model, ids).propose(draft_rows(ids, sampling=SAMPLED, seed=6), GAMMA)
    assert not torch.equal(other.tokens, props[0].tokens)


def test_tree_children_follow_their_own_path(target, model):
    """Every tree node's children are among the K best of the Markov logits recomputed along that
    node's root path (for the RNN head: the state of that path, not of another node's), for each
    of two requests drafted together."""
    prompts = _prompts(5)[3:5]
    d = with_slots(DSparkDrafter(model), num_slots=2)
    for slot, ids in enumerate(prompts):
        d.begin(slot, ids[:-1], _taps(target, torch.tensor([ids[:-1]]), model.spec.target_layer_ids)[0])
    rows = draft_rows(*prompts)
    topk = 3
    tree = d.propose_tree(rows, TreeConfig(nodes=24, topk=topk, depth=4))
    checked = 0
    for r in range(2):
        tokens, parents, n = tree.tokens[r].tolist(), tree.parents[r].tolist(), tree.sizes[r]
        paths = {0: []}
        for i in range(n):
            paths[i + 1] = paths[parents[i]] + [tokens[i]]
        for node, path in paths.items():
            children = [tokens[i] for i in range(n) if parents[i] == node]
            if not children:
                continue
            with torch.no_grad():
                forced = torch.tensor(path + [0])
                drafted = d.draft_block(rows[r : r + 1], len(path) + 1, lambda k, _, f=forced: f[k : k + 1])
            best = drafted.logits[0, len(path)].topk(topk).indices.tolist()
            assert set(children) <= set(best), (r, node, path, children, best)
            checked += len(path) > 0
    assert checked >= 4  # nodes below the roots were expanded: their state mattered


def test_training_steps_lower_the_loss_and_reach_every_head_tensor(target, model):
    seq = torch.randint(0, 256, (1, 40), generator=torch.Generator().manual_seed(8))
    taps = _taps(target, seq, model.spec.target_layer_ids)
    trained = copy.deepcopy(model).train()
    opt = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad], lr=3e-3)
    with torch.no_grad():
        p_logits = target(seq).logits[0]  # [40, V]
    cfg = DSparkTrainConfig(block_size=GAMMA)
    losses = []
    for _ in range(6):
        batch = block_forward(trained, seq, taps, torch.tensor([[4, 15, 27]]))
        loss, _ = dspark_loss(trained, batch, p_logits[batch.positions[0]][None], cfg)
        opt.zero_grad()
        loss.backward()
        if not losses:
            for name, p in trained.markov_head.named_parameters():
                assert p.grad is not None and p.grad.abs().sum() > 0, name
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses


def test_save_load_round_trip_is_identical(tmp_path, target, model):
    save_dspark(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["markov_head_type"] == model.markov_head.head_type
    loaded = load_dspark(tmp_path, target.config)
    assert loaded.spec == model.spec
    want = model.state_dict()
    assert {k: v for k, v in loaded.state_dict().items() if k in want}.keys() == want.keys()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in want.items())
    ids = _prompts(5)[4]
    for sampling in (SamplingParams(), SAMPLED):
        a = _drafter(target, model, ids).propose(draft_rows(ids, sampling=sampling), GAMMA)
        b = _drafter(target, loaded, ids).propose(draft_rows(ids, sampling=sampling), GAMMA)
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.confidence, b.confidence)


def test_train_cli_config_carries_the_head_type(target):
    model = new_dspark(target, 258, DSparkTrainConfig(block_size=3, num_layers=1, target_layer_ids=[0],
                                                      markov_rank=4, markov_head_type="rnn"))
    assert model.spec.markov_head_type == "rnn" and hasattr(model.markov_head, "joint_proj")
    with pytest.raises(ValueError, match="markov_head_type"):
        DSparkTrainConfig(markov_head_type="lstm")


@pytest.mark.parametrize(
    "head_type,edit,message",
    [
        ("gated", lambda c, t: c.update(markov_head_type="fir"),
         r"markov_head_type is 'fir'; this build supports vanilla, gated, rnn"),
        ("gated", lambda c, t: t.pop("markov_head.gate_proj.weight"),
         r"declares markov_head_type 'gated', whose head needs tensor markov_head.gate_proj.weight"),
        ("rnn", lambda c, t: t.pop("markov_head.joint_proj.bias"),
         r"declares markov_head_type 'rnn', whose head needs tensor markov_head.joint_proj.bias"),
        ("rnn", lambda c, t: c.update(markov_head_type="vanilla"),
         r"hold markov_head.joint_proj.weight of a 'rnn' Markov head but config.json declares "
         r"markov_head_type 'vanilla'"),
        ("gated", lambda c, t: c.update(markov_head_type="rnn"),
         r"hold markov_head.gate_proj.weight of a 'gated' Markov head but config.json declares "
         r"markov_head_type 'rnn'"),
        ("rnn", lambda c, t: t.update({"markov_head.joint_proj.weight": torch.zeros(24, 72)}),
         r"weights do not match .*markov_head.joint_proj.weight"),
    ],
    ids=["unknown-type", "gated-without-gate_proj", "rnn-without-joint_proj-bias", "rnn-declared-vanilla",
         "gated-declared-rnn", "rnn-wrong-shape"],
)
def test_head_type_and_tensor_misfits_refused(tmp_path, target, head_type, edit, message):
    tensors = _deepspec_checkpoint(tmp_path, head_type)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config, tensors)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=message) as err:
        load_dspark(tmp_path, target.config)
    assert str(tmp_path) in str(err.value)


def test_exported_heads_graph_drafts_like_torch(target, model):
    """The engine flavour's graphs (context, block, heads with the RNN state in and out) under
    onnxruntime propose the torch drafter's chains, q and trees."""
    from trtspec.engine.drafter import EngineDSparkDrafter
    from trtspec.engine.ort import OrtSession
    from trtspec.export.dflash import export_dflash_context
    from trtspec.export.dspark import export_dspark_block, export_dspark_heads

    rnn = model.markov_head.head_type == "rnn"
    heads = export_dspark_heads(model)
    assert ("markov_state" in [i.name for i in heads.graph.input]) == rnn
    engine = EngineDSparkDrafter(OrtSession(export_dflash_context(model)),
                                 OrtSession(export_dspark_block(model)), OrtSession(heads),
                                 tuple(model.spec.target_layer_ids), GAMMA,
                                 model.spec.mask_token_id, len(model.layers), GAMMA, None,
                                 *((True, 16) if rnn else ()))  # defaults: a confidence head, no state
    assert engine.has_confidence is True  # the decoder's scheduler reads it
    ids = _prompts(6)[5]
    taps = _taps(target, torch.tensor([ids[:-1]]), model.spec.target_layer_ids)[0]
    for sampling in (SamplingParams(), SAMPLED):
        want = _drafter(target, model, ids).propose(draft_rows(ids, sampling=sampling, seed=3), GAMMA)
        e = with_slots(copy.copy(engine))
        e.begin(0, ids[:-1], taps)
        got = e.propose(draft_rows(ids, sampling=sampling, seed=3), GAMMA)
        assert torch.equal(got.tokens, want.tokens)
        torch.testing.assert_close(got.confidence, want.confidence, atol=1e-5, rtol=1e-4)
        if sampling is SAMPLED:
            torch.testing.assert_close(got.q_probs, want.q_probs, atol=1e-5, rtol=1e-4)
    e = with_slots(copy.copy(engine))
    e.begin(0, ids[:-1], taps)
    greedy = _drafter(target, model, ids).draft_block(draft_rows(ids), GAMMA, lambda _, z: z.argmax(-1))
    block = e.draft_block(draft_rows(ids), GAMMA, lambda _, z: z.argmax(-1))  # logits [R, k, V] too
    torch.testing.assert_close(block.logits, greedy.logits, atol=1e-5, rtol=1e-4)
    e = with_slots(copy.copy(engine))
    e.begin(0, ids[:-1], taps)
    tree = TreeConfig(nodes=16, topk=3, depth=4)
    want = _drafter(target, model, ids).propose_tree(draft_rows(ids), tree)
    got = e.propose_tree(draft_rows(ids), tree)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.parents, want.parents)


def test_a_run_saved_before_the_head_type_field_resumes(tmp_path, target):
    """A state.pt written before `markov_head_type` existed trained a vanilla head; resuming it
    with the default recipe goes on (it was refused: 'markov_head_type was None, this run vanilla'),
    and asking for another head type is still refused."""
    from trtspec.errors import TrtspecError
    from trtspec.train.dflash import resume_state, save_state

    cfg = DSparkTrainConfig(block_size=3, num_layers=1, target_layer_ids=[0], markov_rank=4)
    model = new_dspark(target, 258, cfg)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    gen = torch.Generator().manual_seed(0)
    state_file = tmp_path / "state.pt"
    save_state(state_file, model, opt, gen, 2, cfg)
    old = torch.load(state_file)
    del old["recipe"]["markov_head_type"]
    torch.save(old, state_file)
    start, _ = resume_state(state_file, model, opt, gen, "DSpark", 5, cfg)
    assert start == 2
    with pytest.raises(TrtspecError, match="markov_head_type was vanilla, this run gated"):
        resume_state(state_file, model, opt, gen, "DSpark", 5,
                     cfg.model_copy(update={"markov_head_type": "gated"}))


def test_engine_flavour_build_serves_the_rnn_head_like_torch(tmp_path, target, random_qwen3_dir):
    """Through `load_pipeline` (export bundle, manifest, engine loader): an RNN-head drafter's
    engine flavour decodes token for token and cycle for cycle as its torch flavour."""
    from trtspec.config import ScheduleConfig
    from trtspec.export.bundle import cached_export, load_manifest
    from trtspec.pipeline import load_pipeline

    config = _build_config(tmp_path, _random_model(target, "rnn"), random_qwen3_dir)
    assert load_manifest(cached_export(config))["drafter"]["markov_state_size"] == 16
    full = ScheduleConfig(mode="full")
    decoders = [load_pipeline(config.model_copy(update={"flavour": f})).decoder_for(1, full)
                for f in ("torch", "engine")]
    for ids in _prompts(1):
        want, got = (d.generate(ids, 20) for d in decoders)
        assert got.token_ids == want.token_ids and got.num_target_calls == want.num_target_calls


def _build_config(tmp_path, drafter: DSparkDraftModel, target_dir):
    """A build config of the target at `target_dir` with `drafter` saved beside it."""
    import yaml

    from trtspec.config import load_build_config

    save_dspark(drafter, tmp_path / "drafter")
    config = {"name": "dspark", "flavour": "torch", "target": {"path": str(target_dir)},
              "drafter": {"method": "dspark", "path": str(tmp_path / "drafter")},
              "limits": {"max_tokens": 256}}
    (tmp_path / "dspark.yaml").write_text(yaml.safe_dump(config))
    return load_build_config(tmp_path / "dspark.yaml")


def test_a_drafter_without_a_markov_head_exports_no_markov_state(tmp_path, target, random_qwen3_dir):
    from trtspec.export.bundle import cached_export, load_manifest

    cfg = DSparkTrainConfig(block_size=GAMMA, num_layers=1, target_layer_ids=[0, 2], markov_rank=0,
                            init_from_target=False)
    drafter = new_dspark(target, mask_token_id=258, cfg=cfg)
    assert drafter.markov_head is None
    info = load_manifest(cached_export(_build_config(tmp_path, drafter, random_qwen3_dir)))["drafter"]
    assert info["markov_state_size"] == 0 and info["num_draft_tokens"] == GAMMA
