"""Engine flavour on CPU: the exported ONNX graphs under onnxruntime (plugin ops as ONNX functions)
are token-identical to the torch flavour, carry the `trtspec` plugin nodes, refuse what they
cannot export, and `trtspec build --flavour engine` writes a manifest whose hashes hold."""

from __future__ import annotations

import copy
import json
import shutil

import numpy as np
import onnx
import pytest
import torch
import yaml
from click.testing import CliRunner
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM, Qwen3Config

from plugins.confidence_verify.reference import draw_uniforms, verify_sampling_explicit
from tests.conftest import REPO, _small_kwargs, assert_samples_follow_target, draft_rows, with_slots
from trtspec.cli import main
from trtspec.config import EngineConfig, ScheduleConfig, load_build_config
from trtspec.engine.cpu_plugins import attach_cpu_plugins
from trtspec.engine.ort import OrtSession
from trtspec.errors import CheckpointError, ConfigError
from trtspec.export.bundle import cached_export, load_manifest, sha256_file
from trtspec.export.graph import FLOAT, INT32, PLUGIN_DOMAIN, GraphBuilder
from trtspec.export.plugins import kv_injection_attention
from trtspec.export.target import check_exportable, export_target
from trtspec.export.verify import export_verify_greedy, export_verify_sampling
from trtspec.models.target import Chunk, TargetModel
from trtspec.output import MARKER
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.grammar import Guide
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.verify import VerifyOutput, verify_greedy

FULL = ScheduleConfig(mode="full")
CONFIG = REPO / "build_configs" / "tiny-dflash.yaml"
DSPARK_CONFIG = REPO / "build_configs" / "tiny-dspark.yaml"


@pytest.fixture(scope="module", autouse=True)
def _export_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRTSPEC_CACHE_DIR", str(tmp_path_factory.mktemp("engine-cache")))
        yield


@pytest.fixture(scope="module")
def pipelines():
    """(flavour, name) -> Pipeline for name in target (no drafter), dflash, dspark."""
    out = {}
    for name, path, drafter in (("target", CONFIG, False), ("dflash", CONFIG, True),
                                ("dspark", DSPARK_CONFIG, True)):
        config = load_build_config(path)
        for flavour in ("torch", "engine"):
            out[(flavour, name)] = load_pipeline(config.model_copy(update={"flavour": flavour}),
                                                 use_drafter=drafter)
    return out


def test_tensorrt_backend_without_engines_or_tensorrt_names_both_fixes(pipelines):
    """`engine.backend: tensorrt` on a machine without TensorRT, over an export with no engines
    (the one the fixture made): the error names the GPU node's build and the onnxruntime backend."""
    from trtspec.engine.trt import tensorrt_available

    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    config = load_build_config(CONFIG)
    config = config.model_copy(update={"flavour": "engine",
                                       "engine": EngineConfig(backend="tensorrt")})
    with pytest.raises(ConfigError, match=r"no tensorrt engine for graph 'target'; on the GPU node run "
                                          r"`python -m trtspec.engine.build .*` \(TensorRT is not installed "
                                          r"here: `engine.backend: onnxruntime` runs the ONNX graphs"):
        load_pipeline(config, use_drafter=False)


def _prompts(per_task: int) -> list[str]:
    return [p for task in ("code", "math", "chat") for p in load_prompts(task)[:per_task]]


@pytest.mark.parametrize("name", ["target", "dflash", "dspark"])
def test_engine_flavour_token_identical_to_torch(pipelines, name):
    torch_p, engine_p = pipelines[("torch", name)], pipelines[("engine", name)]
    assert type(engine_p.target).__name__ == "EngineTarget"
    assert type(engine_p.verifier).__name__ == "GraphVerifier"
    prompts = _prompts(3)
    want_decoder, got_decoder = torch_p.decoder_for(1, FULL), engine_p.decoder_for(1, FULL)
    for prompt in prompts:
        ids = torch_p.tokenizer.encode(prompt)
        want = want_decoder.generate(ids, 48)
        got = got_decoder.generate(ids, 48)
        assert got.token_ids == want.token_ids, prompt
        assert got.num_target_calls == want.num_target_calls  # same acceptance, cycle by cycle


def test_engine_flavour_under_penalties_token_identical_to_torch(pipelines):
    """Logit bias and penalties reach the verify graphs through the decoder's logits: the same text
    as the torch flavour's under them, which is not the unpenalized one."""
    sampling = SamplingParams(presence_penalty=0.8, frequency_penalty=0.4, repetition_penalty=1.3,
                              logit_bias=((ord(" "), -3.0), (ord("e"), 2.0)))
    torch_p, engine_p = pipelines[("torch", "dflash")], pipelines[("engine", "dflash")]
    want_decoder, got_decoder = torch_p.decoder_for(2, FULL), engine_p.decoder_for(2, FULL)
    for prompt in _prompts(1):
        ids = torch_p.tokenizer.encode(prompt)
        want = want_decoder.generate(ids, 48, sampling)
        assert got_decoder.generate(ids, 48, sampling).token_ids == want.token_ids, prompt
        assert want.token_ids != want_decoder.generate(ids, 48).token_ids, prompt


@pytest.mark.parametrize("name", ["dflash", "dspark"])
def test_engine_flavour_under_a_guide_token_identical_to_torch(pipelines, name):
    """A guide masks the verify graphs' logits and the drafter graphs' drafts through the decoder: the
    same text and the same acceptance as the torch flavour's."""
    guide = Guide("json_schema", '{"type": "object", "properties": {"n": {"type": "integer"}}}')
    torch_p, engine_p = pipelines[("torch", name)], pipelines[("engine", name)]
    want_decoder, got_decoder = torch_p.decoder_for(1, FULL), engine_p.decoder_for(1, FULL)
    for prompt in _prompts(1):
        ids = torch_p.tokenizer.encode(prompt)
        want = want_decoder.generate(ids, 48, guide=torch_p.guides.compile(guide))
        got = got_decoder.generate(ids, 48, guide=engine_p.guides.compile(guide))
        assert got.token_ids == want.token_ids and got.num_target_calls == want.num_target_calls, prompt
        assert want.token_ids != want_decoder.generate(ids, 48).token_ids, prompt


def test_dspark_engine_confidences_match_torch(pipelines):
    """The heads graph gives the torch drafter's Markov drafts and STS-scaled confidences."""
    proposals = []
    for flavour in ("torch", "engine"):
        p = pipelines[(flavour, "dspark")]
        assert p.drafter.sts_temperatures is not None  # the shipped drafter is calibrated
        ids = p.tokenizer.encode(load_prompts("chat")[1])
        target, drafter = copy.copy(p.target), with_slots(copy.copy(p.drafter))
        target.allocate(1, 256)
        out = target.forward([Chunk(0, torch.tensor(ids))])
        drafter.begin(0, ids, out.hidden)
        committed = ids + [int(out.logits[-1].argmax())]
        proposals.append(drafter.propose(draft_rows(committed), 15))
    want, got = proposals
    assert got.tokens.tolist() == want.tokens.tolist()
    torch.testing.assert_close(got.confidence, want.confidence, atol=1e-5, rtol=1e-4)
    assert 0.05 < float(want.confidence.std())  # confidences that vary: the test means something


@pytest.mark.parametrize("name", ["dflash", "dspark"])
def test_engine_drafter_proposes_for_rows_of_unequal_contexts_as_for_each_alone(pipelines, name):
    """Two rows whose contexts differ in length, drafted in one block-graph run (fed the longer
    context's width, each row its own ctx_lens), propose what each proposes alone."""
    p = pipelines[("engine", name)]
    prompts = [p.tokenizer.encode(text) for text in load_prompts("chat")[:2]]
    assert len(prompts[0]) != len(prompts[1])
    target, together = copy.copy(p.target), with_slots(copy.copy(p.drafter), 2)
    target.allocate(2, 256)
    committed, hidden = [], []
    for slot, ids in enumerate(prompts):
        out = target.forward([Chunk(slot, torch.tensor(ids))])
        together.begin(slot, ids, out.hidden)
        committed.append(ids + [int(out.logits[-1].argmax())])
        hidden.append(out.hidden)
    got = together.propose(draft_rows(*committed), 8)
    for slot, ids in enumerate(prompts):
        alone = with_slots(copy.copy(p.drafter))
        alone.begin(0, ids, hidden[slot])
        want = alone.propose(draft_rows(committed[slot]), 8)
        assert got.tokens[slot].tolist() == want.tokens[0].tolist(), slot
        if want.confidence is not None:
            torch.testing.assert_close(got.confidence[slot], want.confidence[0], atol=1e-5, rtol=1e-4)


def test_engine_sampling_follows_target(pipelines):
    """Sampling through the engine flavour (drafts, then the `confidence_verify_sampling` graph)
    emits tokens with the target's law, 8 requests at a time (ragged draft lengths in one graph call)."""
    model = pipelines[("torch", "target")].target.model
    spec = pipelines[("engine", "dspark")].decoder_for(8, FULL)
    sampling = SamplingParams(temperature=1.0, top_k=3)
    assert_samples_follow_target(model, spec, list(b"    def __init__(self"), sampling, steps=4, n=1000)


def _float16(config):
    return config.model_copy(update={"flavour": "engine",
                                     "target": config.target.model_copy(update={"dtype": "float16"})})


def test_float16_graphs_close_to_float32_and_lossless():
    """`target.dtype: float16` exports half-precision graphs (weights, activations, K/V); their
    logits stay close to the float32 torch model, and speculation over them is exactly their own
    target's greedy decoding (losslessness is relative to the target that verifies)."""
    config = load_build_config(CONFIG)
    spec, plain = load_pipeline(_float16(config)), load_pipeline(_float16(config), use_drafter=False)
    assert spec.target.graph.precision == "float16" and spec.target.graph.cache[0].dtype == np.float16
    half, reference = copy.copy(spec.target), copy.copy(load_pipeline(config, use_drafter=False).target)
    for t in (half, reference):
        t.allocate(1, 256)
    ids = torch.tensor(spec.tokenizer.encode(load_prompts("code")[2]))
    got, want = half.forward([Chunk(0, ids)]).logits, reference.forward([Chunk(0, ids)]).logits  # [s, V]
    assert got.dtype == torch.float32 and half.graph.cache[0].dtype == np.float16
    assert (got - want).abs().max() < 0.1 * want.abs().max()  # half-precision rounding, not garbage
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95
    spec_decoder, plain_decoder = spec.decoder_for(1, FULL), plain.decoder_for(1, FULL)
    for prompt in _prompts(2):
        prompt_ids = spec.tokenizer.encode(prompt)
        want = plain_decoder.generate(prompt_ids, 64).token_ids
        assert spec_decoder.generate(prompt_ids, 64).token_ids == want


def test_bfloat16_export_is_refused_with_the_field(tmp_path):
    bad = tmp_path / "bf16.yaml"
    bad.write_text(CONFIG.read_text().replace("path: builtin:tiny-target",
                                              "path: builtin:tiny-target\n  dtype: bfloat16", 1))
    assert "dtype: bfloat16" in bad.read_text()
    args = ["build", str(bad), "--out", str(tmp_path / "o"), "--flavour", "engine"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output  # the export cannot finish: a run-time failure
    assert "target.dtype 'bfloat16' has no engine export" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_target_graph_matches_hf_llama(random_llama_dir):
    """A non-Qwen3 layout (no q/k norm) through the same exporter: logits and cache agree."""
    _assert_target_graph_matches_hf(random_llama_dir)


def test_target_graph_matches_hf_llama_with_yarn_rope(tmp_path):
    """YaRN scales the RoPE tables by its attention factor (0.1·ln 4 + 1 here): the graph's tables
    too, else every logit is off."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 1e4}
    model = LlamaForCausalLM(LlamaConfig(**_small_kwargs(3), rope_parameters=rope))
    assert abs(model.model.rotary_emb.attention_scaling - 1.1386) < 1e-4
    model.save_pretrained(tmp_path)
    _assert_target_graph_matches_hf(tmp_path)


def _assert_target_graph_matches_hf(target_dir):
    """Two rows in one batch (a head reshape that pinned the batch to 1 would mix them up), each as
    the torch target computes it alone."""
    target = TargetModel.from_pretrained(target_dir, tap_layer_ids=(0, 2))
    session = OrtSession(export_target(target.model, (0, 2)))
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    empty = np.zeros((2, 2, 0, 16), np.float32)
    feeds = {"input_ids": ids.numpy(), "position_ids": np.arange(9)[None].repeat(2, 0),
             "attention_mask": np.tril(np.ones((2, 9, 9), bool)),
             **{f"past_{kind}_{i}": empty for i in range(3) for kind in ("key", "value")}}
    out = session.run(feeds)
    for row in range(2):
        target.allocate(1, 16)
        ref = target.forward([Chunk(0, ids[row])])
        np.testing.assert_allclose(out["logits"][row], ref.logits.numpy(), atol=1e-4)
        np.testing.assert_allclose(out["hidden_taps"][row], ref.hidden.numpy(), atol=1e-4)
    assert out["present_key_0"].shape == (2, 2, 9, 16)


def test_plugin_nodes_in_exported_graphs(tmp_path):
    args = ["build", str(CONFIG), "--out", str(tmp_path / "b"), "--flavour", "engine"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    block = onnx.load(str(tmp_path / "b" / "dflash_block.onnx"))
    nodes = [n for n in block.graph.node if n.domain == "trtspec"]
    assert [n.op_type for n in nodes] == ["kv_injection_attention"] * 2  # one per drafter layer
    for node in nodes:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs == {"plugin_namespace": b"trtspec", "aot": 1}
    assert not block.functions  # the file is TensorRT's input: no CPU fallback inside
    for rule in ("greedy", "sampling"):
        verify = onnx.load(str(tmp_path / "b" / f"verify_{rule}.onnx"))
        plugin_ops = [n.op_type for n in verify.graph.node if n.domain == "trtspec"]
        assert plugin_ops == [f"confidence_verify_{rule}"]
        assert not verify.functions


def test_dspark_build_has_heads_graph_and_calibration(tmp_path):
    result = CliRunner().invoke(main, ["build", str(DSPARK_CONFIG), "--out", str(tmp_path / "b"),
                                       "--flavour", "engine"])
    assert result.exit_code == 0, result.output
    manifest = load_manifest(tmp_path / "b")
    assert {"dspark_context", "dspark_block", "dspark_heads"} <= set(manifest["graphs"])
    info = manifest["drafter"]
    assert info["method"] == "dspark" and info["num_draft_tokens"] == info["block_size"] == 15
    assert len(info["sts_temperatures"]) == 15 and info["has_confidence"]
    block = onnx.load(str(tmp_path / "b" / "dspark_block.onnx"))
    assert [n.op_type for n in block.graph.node if n.domain == "trtspec"] == ["kv_injection_attention"] * 2
    heads = manifest["graphs"]["dspark_heads"]
    assert [o["name"] for o in heads["outputs"]] == ["logits", "confidence_logits"]


def test_verify_graph_matches_torch_verifier():
    session = OrtSession(export_verify_greedy(50))
    gen = torch.Generator().manual_seed(0)
    for b, k in [(5, 1), (7, 6), (3, 15)]:
        logits = torch.randn(b, k + 1, 50, generator=gen).round(decimals=0)  # ties: first index wins
        draft = logits.argmax(-1)[:, :k].clone()
        flip = torch.rand(b, k, generator=gen) < 0.2
        draft[flip] = (draft[flip] + 1) % 50
        lens = torch.randint(0, k + 1, (b,), generator=gen)
        want = verify_greedy(draft, logits, lens)
        out = session.run({"draft_tokens": draft.int().numpy(), "target_logits": logits.numpy(),
                           "draft_lens": lens.int().numpy()})
        assert out["num_accepted"].tolist() == want.num_accepted.tolist()
        assert out["tokens"].tolist() == want.tokens.tolist()


def _random_sampling_case(gen: torch.Generator, b: int, k: int, vocab: int):
    """Sparse p and q (disjoint support at times, q == p at times), drafts from q, ragged lens."""
    def sparse(*shape):
        probs = torch.softmax(3 * torch.randn(*shape, generator=gen), -1)
        probs = probs * (torch.rand(*shape, generator=gen) > 0.5)
        probs[..., int(torch.randint(0, vocab, (1,), generator=gen))] += 1e-3
        return probs / probs.sum(-1, keepdim=True)
    p, q = sparse(b, k + 1, vocab), sparse(b, k, vocab)
    if torch.rand(1, generator=gen) < 0.3:
        q = p[:, :k].clone()
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(b, k) if k else \
        torch.zeros(b, 0, dtype=torch.long)
    lens = torch.randint(0, k + 1, (b,), generator=gen)
    return draft, q, p, lens, *draw_uniforms(b, k, gen)


def test_sampling_verify_graph_matches_reference():
    """`confidence_verify_sampling` under onnxruntime equals the plugin's torch reference exactly."""
    session = OrtSession(export_verify_sampling(9))
    gen = torch.Generator().manual_seed(1)
    accepted = 0
    for trial in range(120):
        b, k = int(torch.randint(1, 6, (1,), generator=gen)), trial % 7
        draft, q, p, lens, uniforms, u_last = _random_sampling_case(gen, b, k, 9)
        want = verify_sampling_explicit(draft, q, p, uniforms, u_last, lens)
        out = session.run({"draft_tokens": draft.int().numpy(), "q_probs": q.numpy(), "p_probs": p.numpy(),
                           "draft_lens": lens.int().numpy(), "uniforms": uniforms.numpy(),
                           "u_last": u_last.numpy()})
        assert out["num_accepted"].tolist() == want.num_accepted.tolist(), trial
        assert out["tokens"].tolist() == want.tokens.tolist(), trial
        accepted += int(want.num_accepted.sum())
    assert accepted > 50  # both accepting and rejecting rows were exercised


def test_sampling_verify_graph_reproduces_target():
    """The law of the graph's emitted tokens is p (the check that catches a broken rule in
    tests/test_plugins.py, run on the graph)."""
    from tests.test_plugins import P_ROWS, TV_BOUND, _emitted_law, _tv

    session = OrtSession(export_verify_sampling(P_ROWS.shape[1]))

    def graph_rule(draft, q, p, uniforms, u_last, lens):
        b, k = draft.shape
        out = session.run({"draft_tokens": draft.int().numpy(), "q_probs": q.contiguous().numpy(),
                           "p_probs": p.contiguous().numpy(),
                           "draft_lens": np.full(b, k, np.int32) if lens is None else lens.int().numpy(),
                           "uniforms": uniforms.numpy(), "u_last": u_last.numpy()})
        return VerifyOutput(num_accepted=torch.from_numpy(out["num_accepted"]).long(),
                            tokens=torch.from_numpy(out["tokens"]).long())

    for position in range(3):
        emitted = _emitted_law(graph_rule, position, seed=40 + position)
        assert _tv(emitted, P_ROWS[position]) < TV_BOUND, (position, emitted)


@pytest.mark.parametrize("draft_len", [1, 2])
def test_sampling_verify_graph_gives_the_target_s_joint_law_exactly(draft_len):
    """The graph's output law computed exactly over its randomness, as tests/test_verify.py does
    for the torch rule (q and p depending on the prefix; a cut block and a whole one)."""
    from tests.test_verify import EXACT_V, _assert_target_law, _enumerated_law
    from trtspec.engine.verify import GraphVerifier

    graph = GraphVerifier(None, OrtSession(export_verify_sampling(EXACT_V)))
    _assert_target_law(_enumerated_law(graph.sampling, draft_len), draft_len)


def test_attention_node_on_cpu_matches_plugin_reference():
    """The onnxruntime function behind `trtspec::kv_injection_attention`: GQA, ctx_lens masking."""
    from plugins.kv_injection_attention.reference import kv_injection_attention_reference

    g = GraphBuilder("attn")
    names = ["q", "ctx_k", "ctx_v", "blk_k", "blk_v"]
    dims = [["b", 8, "B", 32]] + [["b", 2, "c", 32]] * 2 + [["b", 2, "B", 32]] * 2
    args = [g.input(n, FLOAT, d) for n, d in zip(names, dims, strict=True)]
    args.append(g.input("ctx_lens", INT32, ["b"]))
    g.output(kv_injection_attention(g, *args), "out", FLOAT, ["b", 8, "B", 32])
    session = OrtSession(g.model("attn", {PLUGIN_DOMAIN: 1}))
    gen = torch.Generator().manual_seed(0)
    b, block, c = 3, 7, 37
    shapes = [(b, 8, block, 32), (b, 2, c, 32), (b, 2, c, 32), (b, 2, block, 32), (b, 2, block, 32)]
    tensors = [torch.randn(s, generator=gen) for s in shapes]
    lens = torch.tensor([37, 5, 0], dtype=torch.int32)
    feeds = {n: t.numpy() for n, t in zip(names, tensors, strict=True)}
    out = session.run({**feeds, "ctx_lens": lens.numpy()})
    want = kv_injection_attention_reference(*tensors, lens)
    np.testing.assert_allclose(out["out"], want.numpy(), atol=1e-5)


def test_sampling_verify_graph_draws_the_last_token_with_mass_when_u_last_finds_none():
    """u_last = 1 makes u·total equal the total, so no cdf entry exceeds it: the token drawn is then
    the last one p gives mass (as torch's inverse_cdf), never a token p rules out."""
    from trtspec.spec.verify import inverse_cdf

    vocab = 6
    session = OrtSession(export_verify_sampling(vocab))
    gen = torch.Generator().manual_seed(7)
    p = torch.rand(5, 1, vocab, generator=gen) * (torch.rand(5, 1, vocab, generator=gen) > 0.5)
    p[0, 0] = torch.tensor([1.0, 0, 0, 0, 0, 0])  # mass on the first token only
    p[1, 0] = torch.tensor([0.25, 0.75, 0, 0, 0, 0])
    p[2:, 0, 0] += 0.1  # every row has some mass
    p = p / p.sum(-1, keepdim=True)
    out = session.run({"draft_tokens": np.zeros((5, 0), np.int32),
                       "q_probs": np.zeros((5, 0, vocab), np.float32), "p_probs": p.numpy(),
                       "draft_lens": np.zeros(5, np.int32),
                       "uniforms": np.zeros((5, 0), np.float32), "u_last": np.ones(5, np.float32)})
    last_with_mass = [int(np.flatnonzero(row)[-1]) for row in p[:, 0].numpy()]
    assert last_with_mass[:2] == [0, 1]
    assert out["num_accepted"].tolist() == [0] * 5
    assert out["tokens"][:, 0].tolist() == last_with_mass
    assert last_with_mass == inverse_cdf(p[:, 0], torch.ones(5)).tolist()


def test_cpu_plugins_import_the_plugin_domain_only_where_a_graph_uses_it():
    """A graph using `trtspec` ops that does not import the domain runs once the functions are attached
    (the domain imported once); a graph without such ops comes back unchanged."""
    model = export_verify_greedy(8)
    assert [o.domain for o in model.opset_import].count(PLUGIN_DOMAIN) == 1
    bare = copy.deepcopy(model)
    kept = [o for o in bare.opset_import if o.domain != PLUGIN_DOMAIN]
    del bare.opset_import[:]
    bare.opset_import.extend(kept)
    for m in (model, bare):
        attached = attach_cpu_plugins(m)
        assert [o.domain for o in attached.opset_import].count(PLUGIN_DOMAIN) == 1
    logits = np.random.default_rng(3).standard_normal((2, 3, 8)).astype(np.float32)
    feeds = {"draft_tokens": logits[:, :2].argmax(-1).astype(np.int32), "target_logits": logits,
             "draft_lens": np.array([2, 1], np.int32)}
    out = OrtSession(bare).run(feeds)
    assert out["num_accepted"].tolist() == [2, 1]
    assert out["tokens"].tolist() == [[*feeds["draft_tokens"][0], logits[0, 2].argmax()],
                                      [feeds["draft_tokens"][1, 0], logits[1, 1].argmax(), -1]]
    g = GraphBuilder("plain")
    g.output(g.input("x", FLOAT, [2]), "y", FLOAT, [2])
    plain = g.model("no plugin ops")
    assert attach_cpu_plugins(plain) == plain


def test_export_refuses_unsupported_architecture():
    with pytest.raises(CheckpointError, match="model_type 'gpt2'"):
        check_exportable(GPT2Config())
    with pytest.raises(CheckpointError, match="hidden_act 'gelu'"):
        check_exportable(Qwen3Config(hidden_act="gelu"))


def test_build_writes_manifest_with_matching_hashes(tmp_path):
    out = tmp_path / "engine"
    result = CliRunner().invoke(main, ["build", str(CONFIG), "--out", str(out), "--flavour", "engine"])
    assert result.exit_code == 0, result.output
    assert "engines not built" in result.output and f"python -m trtspec.engine.build {out}" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == {"target.onnx", "dflash_context.onnx", "dflash_block.onnx",
                                      "verify_greedy.onnx", "verify_sampling.onnx",
                                      "verify_tree_greedy.onnx", "verify_tree_sampling.onnx"}
    for name, digest in manifest["files"].items():
        assert sha256_file(out / name) == digest
    assert manifest["config"]["flavour"] == "engine" and manifest["versions"]["onnxruntime"]
    target_inputs = {i["name"]: i["shape"] for i in manifest["graphs"]["target"]["inputs"]}
    assert target_inputs["past_key_0"] == ["batch", 2, "past", 64]
    load_manifest(out)  # hashes verified
    written = [p for p in out.rglob("*") if p.is_file() and p.name != MARKER]
    assert sorted(result.stdout.split()) == sorted(map(str, written))  # each file once, no folder
    moved = tmp_path / "moved"  # the build travels whole to the GPU node: its served YAML finds it there
    shutil.copytree(out, moved)
    served = load_build_config(next(moved.glob("model_repository/*/1/build_config.yaml")))
    assert served.engine.resolved_folder == moved.resolve()
    (out / "target.onnx").write_bytes(b"tampered")
    with pytest.raises(ValueError, match="differs from its sha256"):
        load_manifest(out)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_an_export_records_its_drafter_and_refuses_more_drafts_than_its_block_holds(tmp_path):
    """DFlash's slot 0 holds the anchor: block 16 drafts 15 at most (unset: 15), 16 is refused and
    leaves nothing; without the drafter the manifest has no drafter, path, taps nor drafter graphs."""
    from trtspec.export.bundle import export_bundle

    config = load_build_config(CONFIG)
    plain = export_bundle(config, tmp_path / "plain", use_drafter=False)
    assert (plain["drafter"], plain["paths"]["drafter"], plain["tap_layer_ids"]) == (None, None, [])
    assert set(plain["graphs"]) == {"target", "verify_greedy", "verify_sampling", "verify_tree_greedy",
                                    "verify_tree_sampling"}
    assert (plain["vocab_size"], plain["num_layers"], plain["precision"]) == (264, 6, "float32")
    drafter = config.drafter
    full = load_manifest(cached_export(config))
    assert full["paths"]["drafter"] == str(drafter.resolved_path)
    assert full["drafter"] == {"method": "dflash", "block_size": 16, "mask_token_id": 258, "num_layers": 2,
                               "num_draft_tokens": 15}
    too_many = config.model_copy(update={"drafter": drafter.model_copy(update={"num_draft_tokens": 16})})
    with pytest.raises(CheckpointError, match="num_draft_tokens is 16 but the dflash block size 16 yields "
                                              "at most 15 drafts"):
        export_bundle(too_many, tmp_path / "many")
    assert not (tmp_path / "many").exists()


def test_the_export_cache_key_follows_the_checkpoint_files_not_their_folder(tmp_path):
    """A copy of the drafter keys as the original once `path` is ignored; another file beside it
    does not change the key, an edited config.json or weights file does, and so does leaving the
    drafter out."""
    from trtspec.config import ASSETS_DIR
    from trtspec.export.bundle import content_key

    config = load_build_config(CONFIG)
    copy_dir = shutil.copytree(ASSETS_DIR / "tiny-dflash-b16", tmp_path / "drafter")
    copied = config.model_copy(update={"drafter": config.drafter.model_copy(update={"path": str(copy_dir)})})
    key = content_key(config, True, ignore=("path",))
    assert content_key(copied, True, ignore=("path",)) == key
    assert content_key(copied, True) != content_key(config, True)  # unless ignored, the path counts
    assert content_key(config, False, ignore=("path",)) != key
    (copy_dir / "notes.txt").write_text("not a checkpoint file")
    assert content_key(copied, True, ignore=("path",)) == key
    for name in ("config.json", "model.safetensors"):
        data = (copy_dir / name).read_bytes()
        (copy_dir / name).write_bytes(data + b" ")
        assert content_key(copied, True, ignore=("path",)) != key, name
        (copy_dir / name).write_bytes(data)


_DSPARK_INFO = {"method": "dspark", "block_size": 15, "mask_token_id": 258, "num_layers": 2,
                "num_draft_tokens": 15, "has_confidence": True, "markov_state_size": 0}


@pytest.mark.parametrize("edit,said", [
    # bool("false") was true: a drafter without a confidence head run as one with it
    ({"drafter": {**_DSPARK_INFO, "has_confidence": "false"}}, "has_confidence must be true or false"),
    ({"drafter": {**_DSPARK_INFO, "markov_state_size": 2.5}}, "markov_state_size must be an integer"),
    ({"drafter": {**_DSPARK_INFO, "markov_state_size": "abc"}}, "markov_state_size must be an integer"),
    ({"drafter": {**_DSPARK_INFO, "block_size": "15"}}, "drafter.block_size must be an integer, got '15'"),
    ({"drafter": {**_DSPARK_INFO, "method": 1}}, "drafter.method must be dflash or dspark, got 1"),
    ({"drafter": "dspark"}, "drafter must be an object, got 'dspark'"),
    # tuple("135") made three string layer ids
    ({"tap_layer_ids": "135"}, "tap_layer_ids must be a list of layer indices, got '135'"),
    ({"precision": 1}, "precision must be one of float32, float16, got 1"),  # a TypeError from numpy
    # each temperature a number in (0, inf): the confidences divide by them
    ({"drafter": {**_DSPARK_INFO, "sts_temperatures": [1.5, 0.0]}}, "sts_temperatures must be a list of "
                                                                     r"numbers > 0, got \[1.5, 0.0\]"),
    ({"drafter": {**_DSPARK_INFO, "sts_temperatures": [-1.0]}}, "sts_temperatures must be a list"),
    ({"drafter": {**_DSPARK_INFO, "sts_temperatures": [float("inf")]}}, "sts_temperatures must be a list"),
    ({"drafter": {**_DSPARK_INFO, "sts_temperatures": "1.5"}}, "sts_temperatures must be a list"),
])
def test_hand_edited_manifest_fields_are_named(tmp_path, edit, said):
    from trtspec.engine.load import load_engine_models
    from trtspec.errors import TrtspecError
    from trtspec.export.bundle import EXPORT_FORMAT

    manifest = {"format": EXPORT_FORMAT, "files": {}, "precision": "float32", "tap_layer_ids": [1, 3, 5],
                "drafter": _DSPARK_INFO, **edit}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TrtspecError, match=f"{tmp_path / 'manifest.json'}: .*{said}"):
        load_engine_models(load_build_config(DSPARK_CONFIG), folder=tmp_path, backend="onnxruntime")


def test_build_error_leaves_no_output(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("flavour: engine\ntarget: {path: builtin:tiny-target}\n"
                   "drafter: {method: draft_model, path: builtin:tiny-draft}\n")
    result = CliRunner().invoke(main, ["build", str(bad), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "drafter.method 'draft_model' has no engine export" in result.output
    assert "Traceback" not in result.output
    assert "no `drafter:`" in result.output  # build has no --drafter option to point at
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_flavour_bench_smoke():
    """`python -m trtspec.bench.flavours`: every row present, the engine float32 rows token-equal."""
    from trtspec.bench.flavours import compare_flavours, markdown

    results = compare_flavours(load_build_config(DSPARK_CONFIG), ["code", "math"], 1, 24, float16=True,
                               concurrency=2)
    rows = {(r["flavour"], r["drafter"]): r for r in results["rows"]}
    assert set(rows) == {(f, d) for f in ("torch", "engine", "engine-fp16") for d in ("none", "dspark")}
    assert rows[("engine", "dspark")]["greedy_mismatches"] == 0
    assert rows[("engine", "none")]["greedy_mismatches"] == 0
    assert rows[("torch", "dspark")]["target_calls"] < rows[("torch", "none")]["target_calls"]
    batched = {r["flavour"]: r for r in results["batched_rows"]}
    assert set(batched) == {"torch", "engine", "engine-fp16"} and batched["engine"]["greedy_mismatches"] == 0
    assert "| engine-fp16 | dspark | 2 |" in markdown(results)
    # the batched table is relative to torch's own row, rounded as documented
    assert batched["torch"]["vs_torch"] == 1.0
    assert all(r["total_tokens_per_s"] == round(r["total_tokens_per_s"], 1)
               and r["vs_torch"] == round(r["vs_torch"], 2) for r in results["batched_rows"])


def test_flavour_bench_defaults_count_decode_tokens_after_the_first():
    """One repeat, no float16, no batched table by default; 8 greedy tokens of the tiny models (no EOS
    within 8) are 7 decode tokens, and a plain target makes 8 forwards: the prefill, then one a token."""
    from trtspec.bench.flavours import compare_flavours

    results = compare_flavours(load_build_config(DSPARK_CONFIG), ["code"], 1, 8)
    assert (results["repeats"], results["concurrency"], results["batched_rows"]) == (1, 0, [])
    rows = {(r["flavour"], r["drafter"]): r for r in results["rows"]}
    assert set(rows) == {(f, d) for f in ("torch", "engine") for d in ("none", "dspark")}
    assert all(r["tokens"] == 7 and r["greedy_mismatches"] == 0 for r in rows.values())
    assert rows[("torch", "none")]["target_calls"] == rows[("engine", "none")]["target_calls"] == 8
    assert rows[("torch", "none")]["vs_torch"] == rows[("torch", "dspark")]["vs_torch"] == 1.0
    assert all(r["decode_tokens_per_s"] == round(r["decode_tokens_per_s"], 1)
               and r["vs_torch"] == round(r["vs_torch"], 2) and r["decode_s"] == round(r["decode_s"], 3)
               for r in rows.values())
    assert results["machine"]["cpu"]  # the processor's name, else the machine's: never empty


def test_flavour_bench_concurrency_one_adds_no_batched_table():
    from trtspec.bench.flavours import compare_flavours

    results = compare_flavours(load_build_config(DSPARK_CONFIG), ["code"], 1, 8, concurrency=1)
    assert results["concurrency"] == 1 and results["batched_rows"] == []


def test_flavour_bench_command_defaults_and_help(capsys):
    """`python -m trtspec.bench.flavours CONFIG --json`: one repeat, no batched table, JSON indented by
    one; --help says what it compares."""
    from trtspec.bench.flavours import main as flavours_main

    flavours_main([str(DSPARK_CONFIG), "--tasks", "code", "--prompts", "1", "--max-tokens", "8", "--json"])
    out = capsys.readouterr().out
    assert out.startswith('{\n "prompts": 1,\n')
    results = json.loads(out)
    assert (results["repeats"], results["concurrency"], results["batched_rows"]) == (1, 0, [])
    with pytest.raises(SystemExit):
        flavours_main(["--help"])
    assert "Engine flavour (onnxruntime on CPU) vs torch flavour: decode tokens/s" in capsys.readouterr().out


def test_engine_build_help_is_the_usage(capsys):
    """`python -m trtspec.engine.build --help` took --help for a folder (`--help/manifest.json is
    missing`)."""
    from trtspec.engine.build import main as engine_build_main

    assert engine_build_main(["--help"]) == 0
    assert "usage: python -m trtspec.engine.build DIR" in capsys.readouterr().err
    assert engine_build_main(["--bogus"]) == 2
    assert "manifest.json" not in capsys.readouterr().err


class _RecordingSession:
    """A graph session that records the shape of every input it is fed (by graph name)."""

    def __init__(self, inner, name: str, seen: dict[str, list[dict[str, tuple[int, ...]]]]):
        self.inner, self.name, self.seen = inner, name, seen
        self.backend = inner.backend
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def run(self, feeds):
        self.seen.setdefault(self.name, []).append({k: v.shape for k, v in feeds.items()})
        return self.inner.run(feeds)


def _recorded(pipeline, method: str, seen: dict):
    """Copies of an engine pipeline's target, drafter and verifier whose sessions record into `seen`."""
    target, drafter = copy.copy(pipeline.target), copy.copy(pipeline.drafter)
    verifier = copy.copy(pipeline.verifier)
    target.graph = copy.copy(target.graph)
    target.graph.session = _RecordingSession(target.graph.session, "target", seen)
    for part in ("context", "block", "heads"):
        if hasattr(drafter, part):
            setattr(drafter, part, _RecordingSession(getattr(drafter, part), f"{method}_{part}", seen))
    for kind in ("greedy", "sampling", "tree_greedy", "tree_sampling"):
        name = f"{kind}_session"
        setattr(verifier, name, _RecordingSession(getattr(verifier, name), f"verify_{kind}", seen))
    return target, drafter, verifier


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_random_batches_decode_as_alone_within_the_tensorrt_profile(pipelines, method):
    """Random requests (`tests.test_batch._random_request`, seeded) 4 at a time, chains then trees, at a
    context that the longest fills exactly: greedy and Gumbel-coupled texts are the torch target
    alone's, and every shape the loop feeds a graph lies in the optimization profile
    `python -m trtspec.engine.build` gives it. The profile took batch 1 (the drafter, heads and verify
    graphs run one row per request: 4 here) and contexts of one request, 4096, where the packed
    target's cache holds every request's and, until compaction, its rejected drafts: one request
    with 2,099 live positions fed 3,360, four with 3,788 fed 7,489. Now the batch is the config's
    limits.max_concurrency, the packed axes that times the context, and the target compacts before
    its keys outnumber num_slots × capacity."""
    from tests.test_batch import SPS, _random_request
    from trtspec.config import TreeConfig
    from trtspec.engine.build import EngineLimits, dim_ranges, profile_for
    from trtspec.spec.decoder import SpeculativeDecoder

    engine, alone = pipelines[("engine", method)], pipelines[("torch", "target")].decoder_for(1, FULL)
    manifest = load_manifest(cached_export(engine.config, True))
    limits, block = EngineLimits.of_manifest(manifest), manifest["drafter"]["block_size"]
    rng = __import__("random").Random(f"engine-{method}")
    compared = 0
    for tree in (None, TreeConfig(nodes=10, topk=3)):
        requests = [_random_request(rng) for _ in range(8)]
        capacity = max(len(r.prompt) + r.max_new_tokens for r in requests)
        seen: dict = {}
        target, drafter, verifier = _recorded(engine, method, seen)
        schedule = ScheduleConfig(mode="adaptive", probe_every=1)
        decoder = SpeculativeDecoder(target, drafter, engine.end_ids, verifier, schedule, SPS, 4, capacity,
                                     tree=tree)
        got = decoder.generate_batch(requests)
        for request, result in zip(requests, got, strict=True):
            if request.sampling.greedy or request.sampling.gumbel:
                assert result.token_ids == alone.generate_batch([request])[0].token_ids, request
                compared += 1
        assert max(f["attention_mask"][-1] for f in seen["target"]) <= 4 * decoder.target.capacity
        for name, graph in manifest["graphs"].items():
            profile = profile_for(graph, dim_ranges(limits, block, name))
            for feeds in seen.get(name, []):
                for input_name, shape in feeds.items():
                    low, _, high = profile[input_name]
                    assert all(lo <= n <= hi for lo, n, hi in zip(low, shape, high, strict=True)), \
                        (name, input_name, shape, low, high)
        assert max(f["block_ids"][0] for f in seen[f"{method}_block"]) > 1  # batches the old profile refused
    assert compared >= 8


def test_engine_profiles_are_ranges_tensorrt_takes_and_hold_each_step_the_loop_feeds():
    """For random limits and block sizes, every axis of every graph's profile is one TensorRT builds
    (0 <= min <= opt <= max). Its min takes a request's first step: one row, no past, one new token,
    no drafts and no tree nodes. Its opt is a full block's step: the block's tokens after opt_seq of
    context, k = block - 1 drafts (or max_k). Axes fed together agree: k_plus_1 = k + 1,
    nodes_plus_1 = nodes + 1 and total = past + seq. Its max holds max_batch rows, each request's
    context (a block graph) or all of them packed, max_k drafts, a tree's 256 nodes and a DSpark
    head's block or 32 frontier slots (TreeConfig's largest topk)."""
    from trtspec.config import TreeConfig
    from trtspec.engine.build import EngineLimits, dim_ranges

    rng = __import__("random").Random(7)
    for _ in range(200):
        max_seq = rng.choice([16, rng.randint(16, 8192)])
        limits = EngineLimits(max_batch=rng.choice([1, rng.randint(1, 256)]), max_seq=max_seq,
                              opt_seq=rng.choice([1, max_seq, rng.randint(1, max_seq)]),
                              max_k=rng.choice([63, rng.randint(1, 63)]))
        block = rng.choice([2, 16, rng.randint(2, 256)])
        packed = limits.max_batch * limits.max_seq
        for graph in ("target", "dflash_context", "dflash_block", "dspark_heads", "verify_greedy"):
            r = dim_ranges(limits, block, graph)
            case = (limits, block, graph)
            assert all(0 <= lo <= opt <= hi for lo, opt, hi in r.values()), (case, r)
            assert {a: r[a][0] for a in ("batch", "past", "seq", "total", "k", "nodes", "n", "ctx")} == \
                {"batch": 1, "past": 0, "seq": 1, "total": 1, "k": 0, "nodes": 0, "n": 1, "ctx": 1}, case
            assert (r["past"][1], r["seq"][1], r["k"][1]) == \
                (limits.opt_seq, min(block, packed), min(block - 1, limits.max_k)), case
            assert r["block"] == (block, block, block) and r["nodes"][1] == block - 1, case
            assert r["n"][1] == 1, case  # DSpark heads: one slot at a time
            for i in range(3):
                assert r["k_plus_1"][i] == r["k"][i] + 1 and r["nodes_plus_1"][i] == r["nodes"][i] + 1, case
            assert r["total"][:2] == (1, min(r["past"][1] + r["seq"][1], packed)), case
            assert (r["batch"][2], r["seq"][2], r["past"][2], r["total"][2], r["k"][2]) == \
                (limits.max_batch, packed, packed, packed, limits.max_k), case
            assert r["ctx"][2] == (limits.max_seq if graph.endswith("_block") else packed), case
            assert r["nodes"][2] == TreeConfig.model_fields["nodes"].metadata[1].le, case
            assert r["n"][2] == max(block, TreeConfig.model_fields["topk"].metadata[1].le), case
    with pytest.raises(ValueError, match=r"opt_seq \(512\) must be at most max_seq \(256\)"):
        EngineLimits(max_seq=256)
    for manifest, rows in (({"config": {"limits": {"max_concurrency": 3}}}, 3),  # the export's, else 8
                           ({"config": {"limits": None}}, 8), ({"config": None}, 8), ({}, 8)):
        assert EngineLimits.of_manifest(manifest).max_batch == rows, manifest


def _stand_in_builder(monkeypatch) -> list[tuple[str, dict]]:
    """TensorRT cannot run here: `build_engine` writes each engine as its graph's name and records
    (graph file, profile); the rest of `build_engines` runs as on the GPU node."""
    import trtspec.engine.build as engine_build

    calls: list[tuple[str, dict]] = []

    def build_engine(onnx_path, engine_path, profile):
        calls.append((onnx_path.name, profile))
        engine_path.write_bytes(onnx_path.stem.encode())
        return engine_path

    monkeypatch.setattr(engine_build, "build_engine", build_engine)
    return calls


def test_build_engines_records_each_engine_its_hash_and_profile_in_the_manifest(tmp_path, monkeypatch,
                                                                                capsys):
    """`python -m trtspec.engine.build DIR` (TensorRT stood in for) builds one engine per graph with
    the profile of the export's block size and its config's max_concurrency (or the limits given),
    records each engine's file, sha256 and ranges in the manifest, which then still loads, and prints
    the engines; a folder without a manifest is one error line and exit 1, two folders the usage."""
    from trtspec.engine.build import EngineLimits, build_engines, dim_ranges, profile_for
    from trtspec.engine.build import main as engine_build_main

    config = load_build_config(CONFIG).model_copy(update={"flavour": "engine"})
    folder = _edited_export(tmp_path, config, {}, {"block_size": 12, "num_draft_tokens": 11})
    calls = _stand_in_builder(monkeypatch)
    monkeypatch.setattr("sys.argv", ["trtspec.engine.build", str(folder)])
    assert engine_build_main() == 0
    manifest = load_manifest(folder)
    limits = EngineLimits(max_batch=config.limits.max_concurrency)
    assert [name for name, _ in calls] == [g["file"] for g in manifest["graphs"].values()]
    for (_, profile), (name, graph) in zip(calls, manifest["graphs"].items(), strict=True):
        ranges = dim_ranges(limits, 12, name)
        assert profile == profile_for(graph, ranges)
        engine = folder / f"{name}.engine"
        assert manifest["engines"][name] == {"file": engine.name, "sha256": sha256_file(engine),
                                             "profile": {k: list(v) for k, v in ranges.items()}}
    assert capsys.readouterr().out.split() == [str(folder / f"{name}.engine") for name in manifest["graphs"]]
    assert manifest["engines"]["target"]["profile"]["batch"] == [1, 1, 8]
    build_engines(folder, EngineLimits(max_batch=2))
    assert load_manifest(folder)["engines"]["target"]["profile"]["batch"] == [1, 1, 2]
    assert engine_build_main([str(tmp_path / "nowhere")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {tmp_path / 'nowhere' / 'manifest.json'} is missing")
    assert engine_build_main([str(folder), str(folder)]) == 2
    assert "usage: python -m trtspec.engine.build DIR" in capsys.readouterr().err


def test_build_engines_refuses_an_export_drafting_more_than_its_engines_verify(tmp_path, monkeypatch):
    """The verify plugins hold at most max_k (63) drafts a row: an export drafting 64 (a DSpark γ of
    64, a DFlash block of 65) is refused before any engine is built, naming the manifest and the
    field to lower; 63 builds."""
    from trtspec.engine.build import build_engines
    from trtspec.errors import TrtspecError

    config = load_build_config(CONFIG).model_copy(update={"flavour": "engine"})
    folder = _edited_export(tmp_path, config, {}, {"block_size": 64, "num_draft_tokens": 64})
    calls = _stand_in_builder(monkeypatch)
    with pytest.raises(TrtspecError, match=r"manifest.json: the export drafts 64 tokens a step, but TensorRT "
                                           r"engines verify at most 63; .*drafter.num_draft_tokens <= 63"):
        build_engines(folder)
    assert not calls and not load_manifest(folder)["engines"]
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["drafter"]["num_draft_tokens"] = 63
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert len(build_engines(folder)) == len(calls) == len(manifest["graphs"])


def _edited_export(tmp_path, config, fields: dict, drafter: dict | None = None, drop: tuple[str, ...] = ()):
    """A copy of `config`'s cached export (with its drafter) whose manifest has `fields` and the
    drafter section's `drafter` set and its `drop` removed, as a hand edit or an older export would."""
    folder = tmp_path / "engine"
    shutil.copytree(cached_export(config, True), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest.update(fields)
    manifest["drafter"].update(drafter or {})
    for key in drop:
        del manifest["drafter"][key]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_tensorrt_engines_built_for_fewer_requests_than_the_config_are_refused(tmp_path):
    """Engines whose profile takes fewer rows than limits.max_concurrency are refused at load, naming
    both numbers, instead of TensorRT rejecting the first step that runs more requests."""
    from trtspec.engine.load import load_engine_models

    config = load_build_config(CONFIG).model_copy(update={"flavour": "engine"})
    folder = _edited_export(tmp_path, config, {"engines": {"target": {
        "file": "target.engine", "sha256": "0", "profile": {"batch": [1, 1, 1]}}}})
    with pytest.raises(ConfigError, match=r"the target engine takes batches of at most 1 requests, but "
                                          r"limits.max_concurrency is 8; lower it, or rebuild"):
        load_engine_models(config, folder=folder, backend="tensorrt")


def test_engine_batch_check_reads_each_engine_s_profile_and_takes_exactly_the_config_s_rows(tmp_path):
    """The rows an engine takes are its profile's largest batch (1 when the manifest names no
    profile); as many rows as limits.max_concurrency pass, one fewer is refused."""
    from trtspec.engine.load import check_engine_batch

    manifest = {"engines": {"target": {"file": "target.engine", "profile": {"batch": [1, 4, 4]}}}}
    check_engine_batch(tmp_path, manifest, 4)
    with pytest.raises(ConfigError, match="the target engine takes batches of at most 4 requests, but "
                                          "limits.max_concurrency is 5"):
        check_engine_batch(tmp_path, manifest, 5)
    manifest["engines"]["verify_greedy"] = {"file": "verify_greedy.engine"}  # built before profiles
    with pytest.raises(ConfigError, match="the verify_greedy engine takes batches of at most 1 requests"):
        check_engine_batch(tmp_path, manifest, 2)


def test_a_tensorrt_graph_is_the_engine_file_its_manifest_lists(tmp_path):
    """The tensorrt backend opens the engine file the manifest lists for a graph (the onnxruntime
    one the graph's .onnx), and a graph without an engine is refused by name."""
    from trtspec.engine.load import graph_path

    manifest = {"graphs": {"target": {"file": "target.onnx"}, "dflash_block": {"file": "dflash_block.onnx"}},
                "engines": {"target": {"file": "target.engine"}}}
    assert graph_path(tmp_path, manifest, "target", "tensorrt") == tmp_path / "target.engine"
    assert graph_path(tmp_path, manifest, "target", "onnxruntime") == tmp_path / "target.onnx"
    with pytest.raises(ConfigError, match="no tensorrt engine for graph 'dflash_block'"):
        graph_path(tmp_path, manifest, "dflash_block", "tensorrt")


def test_an_older_manifest_without_the_drafter_s_optional_fields_loads_their_defaults(tmp_path):
    """A DSpark export whose manifest predates has_confidence and markov_state_size loads a drafter
    with a confidence head and no Markov state, and keeps the calibration's temperatures (below 1
    too) as they were written."""
    from trtspec.engine.load import load_engine_models

    config = load_build_config(DSPARK_CONFIG).model_copy(update={"flavour": "engine"})
    gamma = load_manifest(cached_export(config, True))["drafter"]["num_draft_tokens"]
    sts = [0.5 + 0.25 * i for i in range(gamma)]
    folder = _edited_export(tmp_path, config, {}, {"sts_temperatures": sts},
                            drop=("has_confidence", "markov_state_size"))
    _, drafter, _ = load_engine_models(config, folder=folder, backend="onnxruntime")
    assert drafter.has_confidence is True and drafter.markov_state_size == 0
    assert drafter.sts_temperatures.tolist() == sts


def test_auto_backend_runs_onnxruntime_where_tensorrt_is_missing_even_with_engines_listed(tmp_path):
    """`backend: auto` over a folder whose manifest lists engines (built on the GPU node) opens the
    ONNX graphs on a machine without TensorRT."""
    from trtspec.engine.load import load_engine_models
    from trtspec.engine.trt import tensorrt_available

    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    config = load_build_config(CONFIG).model_copy(update={"flavour": "engine"})
    folder = _edited_export(tmp_path, config, {"engines": {name: {"file": f"{name}.engine"} for name in (
        "target", "dflash_context", "dflash_block", "verify_greedy", "verify_sampling",
        "verify_tree_greedy", "verify_tree_sampling")}})
    target, drafter, verifier = load_engine_models(config, folder=folder, backend="auto")
    sessions = [target.graph.session, drafter.context, drafter.block, verifier.greedy_session]
    assert [s.backend for s in sessions] == ["onnxruntime"] * 4


def test_packed_target_attends_over_no_more_keys_than_its_slots_hold(pipelines):
    """One request filling its context of 100 with whole blocks (most drafts rejected): the target graph
    was fed up to 186 keys, its live positions plus rejected drafts awaiting compaction (the profile
    bounds keys by num_slots × capacity); now it compacts first, and the text is still the target's."""
    from trtspec.spec.decoder import Request, SpeculativeDecoder

    engine, alone = pipelines[("engine", "dflash")], pipelines[("torch", "target")].decoder_for(1, FULL)
    seen: dict = {}
    target, drafter, verifier = _recorded(engine, "dflash", seen)
    for prompt in load_prompts("chat")[:2]:
        request = Request(list(prompt.encode())[:40], 60, ignore_eos=True)
        decoder = SpeculativeDecoder(target, drafter, engine.end_ids, verifier, FULL, None, 1, 100)
        assert decoder.generate_batch([request])[0].token_ids == alone.generate_batch([request])[0].token_ids
    assert max(f["attention_mask"][-1] for f in seen["target"]) <= 100


def _engine_target(pipelines, num_slots: int, capacity: int):
    """A copy of the engine pipeline's target (its own cache, the session shared), allocated."""
    target = copy.copy(pipelines[("engine", "target")].target)
    target.allocate(num_slots, capacity)
    return target


def _alone(pipelines, ids: torch.Tensor) -> torch.Tensor:
    """The engine target's logits for `ids` fed alone to a fresh slot."""
    return _engine_target(pipelines, 1, 64).forward([Chunk(0, ids)]).logits


IDS = torch.tensor(list(b"def area(r):\n    return 3.14 * r * r"))


def test_engine_target_compacts_dead_positions_once_they_are_half_its_cache(pipelines):
    """Rewound positions stay in the packed cache (masked) while fewer than half of it, and are
    dropped by the first forward that finds them half or more; the logits are those fed alone."""
    t = _engine_target(pipelines, 2, 64)
    t.forward([Chunk(0, IDS[:10]), Chunk(1, IDS[:10])])
    t.rewind(0, 4)  # 4 dead of 20
    t.forward([Chunk(1, IDS[10:11])])
    assert t.graph.cache[0].shape == (1, 2, 21, 64)  # [1, kvh, S, d]: one packed sequence
    t.rewind(0, 3)  # 7 dead of 21: a third, kept
    t.forward([Chunk(1, IDS[11:12])])
    assert t.graph.cache[0].shape[2] == 22
    t.rewind(1, 4)  # 11 dead of 22: half
    out = t.forward([Chunk(1, IDS[8:9])])
    assert t.graph.cache[0].shape[2] == 11 + 1 and t.seq_len(0) == 3 and t.seq_len(1) == 9
    assert t.num_forwards == 4  # counted from the allocation
    torch.testing.assert_close(out.logits, _alone(pipelines, IDS[:9])[-1:], atol=1e-5, rtol=1e-4)


def test_engine_target_compacts_when_its_keys_would_outnumber_what_its_slots_hold(pipelines):
    """With fewer than half dead, a forward whose keys (cache + new tokens) come to num_slots ×
    capacity exactly keeps the dead; one more key than that drops them first."""
    t = _engine_target(pipelines, 2, 16)
    t.forward([Chunk(0, IDS[:12]), Chunk(1, IDS[:12])])
    t.rewind(1, 6)  # 6 dead of 24
    t.forward([Chunk(1, IDS[6:10])])
    t.forward([Chunk(1, IDS[10:14])])  # 28 + 4 keys: 32 = 2 × 16
    assert t.graph.cache[0].shape[2] == 32
    out = t.forward([Chunk(1, IDS[14:15])])  # 33 keys: compacted to 26 first
    assert t.graph.cache[0].shape[2] == 26 + 1
    torch.testing.assert_close(out.logits, _alone(pipelines, IDS[:15])[-1:], atol=1e-5, rtol=1e-4)


def test_engine_target_takes_a_slot_to_its_capacity_and_rewinds_all_of_it(pipelines):
    """A slot holds exactly `capacity` positions (one more is refused), rewinding 0 or all of them
    is taken (one more, or a negative count, is refused), and a slot refilled after a full rewind
    gives the logits of a fresh one. The most positions a request may take are the checkpoint's."""
    t = _engine_target(pipelines, 1, 8)
    assert t.max_positions == t.config.max_position_embeddings == 4096
    t.forward([Chunk(0, IDS[:8])])
    with pytest.raises(ValueError, match="a slot would hold more than its capacity of 8 positions"):
        t.forward([Chunk(0, IDS[8:9])])
    for wrong in (9, -1):
        with pytest.raises(ValueError, match=f"cannot rewind {wrong} positions of slot 0 holding 8"):
            t.rewind(0, wrong)
    t.rewind(0, 0)
    assert t.seq_len(0) == 8
    t.rewind(0, 8)
    assert t.seq_len(0) == 0
    out = t.forward([Chunk(0, IDS[8:12])])
    torch.testing.assert_close(out.logits, _alone(pipelines, IDS[8:12]), atol=1e-5, rtol=1e-4)


def test_a_served_builds_engine_folder_is_named_without_its_dots(tmp_path):
    """A served build's YAML (model_repository/<name>/1/build_config.yaml) names its build folder
    `../../..`, and every error about one of its graphs spelled the path out that way
    (`…/model_repository/trtspec/1/../../../target.onnx is missing`); the folder is named as it is."""
    from trtspec.engine.load import load_engine_models

    served = tmp_path / "model_repository" / "trtspec" / "1"
    served.mkdir(parents=True)
    config = yaml.safe_load(CONFIG.read_text())  # builtin: models, found from anywhere
    config.update(flavour="engine", engine={"folder": "../../..", "backend": "onnxruntime"})
    (served / "build_config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_build_config(served / "build_config.yaml")
    assert loaded.engine.resolved_folder == tmp_path.resolve()
    with pytest.raises(ConfigError) as missing:
        load_engine_models(loaded, folder=loaded.engine.resolved_folder, backend="onnxruntime")
    assert str(tmp_path.resolve() / "manifest.json") in str(missing.value) and ".." not in str(missing.value)
