"""CaptureAudit: on the CPU, the padded decode steps run as a CUDA graph's capture and replays
would, and what a graph would refuse or replay stale is named. The serving models' own steps are
audited in tests/test_batch.py (every drafter, requests joining and leaving, adaptive rows)."""

from __future__ import annotations

import re

import pytest
import torch

from trtspec.models.cuda_graphs import GraphedSteps
from trtspec.models.graph_audit import CaptureAudit
from trtspec.models.kv_slots import Segment
from trtspec.models.target import SUPPORTED_MODEL_TYPES

VOCAB, WIDTH = 50, 8
TABLE = torch.randn(VOCAB, WIDTH, generator=torch.Generator().manual_seed(5))


def _steps(step) -> GraphedSteps:
    return GraphedSteps(step, torch.device("cpu"), num_slots=2, capacity=64, capture=False)


def _decode(steps: GraphedSteps, tokens: list[int], between=lambda i: None) -> list[torch.Tensor]:
    """Feed slot 0 one token a step; each step's output row of its token (a copy, read at once)."""
    rows = []
    for i, token in enumerate(tokens):
        between(i)
        (out,), index = steps.run([Segment(0, i, 1)], torch.tensor([token]))
        rows.append(out[index].clone())
    return rows


@pytest.fixture
def weights():
    gen = torch.Generator().manual_seed(17)
    return torch.randn(VOCAB, WIDTH, generator=gen), torch.randn(WIDTH, WIDTH, generator=gen)


@pytest.fixture
def tokens():
    return torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(3)).tolist()


def test_a_step_a_graph_replays_faithfully_passes_and_decodes_the_same(weights, tokens):
    table, w = weights

    def step(layout, ids):  # ids [B·n] -> ([B·n, W],)
        return (torch.tanh(table[ids] @ w) + layout.positions[:, None],)

    eager = _decode(_steps(step), tokens)
    with CaptureAudit() as audit:
        audited = _decode(_steps(step), tokens)
    assert audit.problems == []
    assert (audit.captures, audit.replays) == (1, len(tokens) - 1)
    assert all(torch.equal(a, b) for a, b in zip(audited, eager, strict=True))


def _problems(step, between=lambda i: None, tokens=(4, 9, 4, 31), inference: bool = False) -> list[str]:
    with CaptureAudit() as audit, torch.inference_mode(inference):
        _decode(_steps(step), list(tokens), between)
    return audit.problems


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference_mode"])
@pytest.mark.parametrize("step,named", [
    (lambda layout, ids: (TABLE[ids] * float(ids.max()),), "reads a device value on the host"),
    (lambda layout, ids: (TABLE[ids] * len(ids.tolist()),), "Tensor.tolist reads a device value on the host"),
    (lambda layout, ids: (TABLE[ids.cpu()],), "Tensor.cpu reads a device value on the host"),
    (lambda layout, ids: (TABLE[ids] * (2 if ids.any() else 1),), "Tensor.__bool__ reads"),
    (lambda layout, ids: (TABLE[ids][ids > 5].sum(0, keepdim=True),), "with a boolean mask"),
    (lambda layout, ids: (TABLE[ids] + torch.arange(WIDTH),), "torch.arange names no device"),
    (lambda layout, ids: (TABLE[ids] + torch.tensor([1.0], device=ids.device),), "lift_fresh"),
], ids=["item", "tolist", "cpu", "bool", "mask-index", "arange", "torch.tensor"])
def test_host_reads_and_host_tensors_inside_the_step_are_named(step, named, inference):
    """Under inference mode too, as the serving loop runs (there `.item()` dispatches as aten.item)."""
    assert any(named in p for p in _problems(step, inference=inference))


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference_mode"])
def test_a_python_value_that_changes_between_steps_would_be_frozen_in_the_graph(weights, inference):
    table, w = weights
    calls = [0]

    def step(layout, ids):
        calls[0] += 1
        return (table[ids] * calls[0],)  # a scalar the capture freezes

    problems = _problems(step, inference=inference)
    assert len(problems) == 1 and "a replay differs from the capture" in problems[0]
    # 2 warm-ups, then the capture: the first replay multiplies by 4
    assert "aten.mul.Tensor argument 1 is 4, frozen in the graph as 3" in problems[0]


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference_mode"])
@pytest.mark.parametrize("width", [WIDTH, 1], ids=["vector", "one-element"])
def test_a_tensor_made_outside_the_step_each_time_would_be_read_at_its_old_address(weights, inference, width):
    """A one-element tensor too (only an empty one has no address to compare)."""
    table, w = weights
    made = []  # every one kept alive, so each sits at a new address

    def step(layout, ids):
        return (table[ids] + made[-1],)

    problems = _problems(step, between=lambda i: made.append(torch.randn(width)), inference=inference)
    assert len(problems) == 1 and "argument 1 is ('outside'" in problems[0]


@pytest.mark.parametrize("output_size,named", [(None, True), (6, False)], ids=["host-size", "output_size"])
def test_repeat_interleave_is_a_host_read_unless_it_is_given_its_output_size(output_size, named):
    """repeat_interleave sizes its output from the repeats' values (a host read), except with
    output_size= given, which a capture accepts."""
    repeats = torch.tensor([1, 2, 3])

    def step(layout, ids):
        return (TABLE[torch.repeat_interleave(ids.repeat(3), repeats, output_size=output_size)],)

    read = "aten.repeat_interleave.Tensor reads a device value on the host"
    assert any(read in p for p in _problems(step)) == named


def _after_capture(step):
    """`step(layout, ids, replay)` as a decode step: replay is False for the warm-ups and the
    capture (the first 3 steps), True for the replays after them."""
    calls = [0]

    def run(layout, ids):
        calls[0] += 1
        return step(layout, ids, calls[0] > 3)

    return run


def _replay_differs(step) -> str:
    problems = _problems(step)
    assert len(problems) == 1 and "a replay differs from the capture" in problems[0]
    return problems[0]


def test_a_tensor_the_step_made_is_named_by_the_op_that_made_it(weights):
    """A replay that reads another of the step's own tensors than the capture did: both arguments
    name the op (numbered as the ops are) whose output they are."""
    table, w = weights

    def step(layout, ids, replay):
        rows = table[ids]
        doubled = rows * 2
        return ((rows if replay else doubled) + 1,)  # the first replay adds to `rows`

    problem = _replay_differs(_after_capture(step))
    i = int(re.search(r"op (\d+) aten.add.Tensor argument 0 is", problem).group(1))
    assert f"argument 0 is ('made', {i - 2}, " in problem  # rows: the index op 2 ops before the add
    assert f"frozen in the graph as ('made', {i - 1}, " in problem  # doubled: the mul just before


def test_a_replay_that_runs_more_ops_than_the_capture_counts_them(weights):
    table, w = weights

    def step(layout, ids, replay):
        rows = table[ids] @ w
        return (rows.neg() if replay else rows,)  # the first replay runs one more op, at the end

    counts = re.search(r"(\d+) ops, the graph has (\d+)$", _replay_differs(_after_capture(step)))
    replayed, captured = map(int, counts.groups())
    assert replayed == captured + 1


def test_a_replay_that_returns_another_number_of_outputs_than_the_capture_is_an_error(weights):
    """The capture's outputs are what a replay rewrites: one output more is not silently dropped."""
    table, w = weights

    def step(layout, ids, replay):
        rows = table[ids] @ w
        return (rows, rows) if replay else (rows,)

    with pytest.raises(ValueError, match="zip"):
        _problems(_after_capture(step))


def test_an_output_read_after_the_models_next_step_reads_garbage_as_a_graph_might(weights):
    """A graph's outputs live in the pool the model's graphs share: the audit overwrites them
    before the next replay of another shape, so a caller that keeps them decodes NaN here."""
    table, w = weights
    steps = _steps(lambda layout, ids: (table[ids] @ w, (table[ids] @ w).argmax(-1)))
    with CaptureAudit():
        kept, kept_ids = [], []
        for i, n in enumerate((1, 2, 1)):  # two shapes, (1, 1, 64) and (1, 2, 64): the third step replays
            (out, top), _ = steps.run([Segment(0, 3 * i, n)], torch.arange(n) + i)
            kept.append(out[:n])  # a view into the graph's outputs, not a copy (index is 0..n-1)
            kept_ids.append(top[:n])
    assert kept[2].isfinite().all() and kept[1].isnan().all()
    # integer outputs (token ids) turn into no token at all, not a token a decode could take for real
    assert (kept_ids[2] >= 0).all() and (kept_ids[1] < 0).all()


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_supported_target_architecture_s_padded_steps_capture_faithfully(model_type):
    """Each model_type the serving target takes (its own transformers modules over slot buffers;
    qwen3_moe routes its experts with grouped matmuls): prefills, then padded chain steps of two
    requests equal the packed ones, both equal the model's own forward over each request's tokens,
    and a CUDA graph could capture and replay every padded step."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtspec.models.target import Chunk, TargetModel

    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
               mlp_only_layers=[]) if model_type == "qwen3_moe" else {}
    config = AutoConfig.for_model(model_type, vocab_size=300, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=16, max_position_embeddings=512, **moe)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    packed, padded = TargetModel(model), TargetModel(model, cuda_graphs=True)
    for t in (packed, padded):
        t.allocate(2, 128)
    gen = torch.Generator().manual_seed(1)
    steps = [[Chunk(s, torch.randint(0, 300, (n,), generator=gen)) for s, n in ((0, 40), (1, 35))]]
    steps += [[Chunk(s, torch.randint(0, 300, (n,), generator=gen)) for s in (0, 1)] for n in (1, 3, 1, 3, 2)]
    fed: dict[int, list[torch.Tensor]] = {0: [], 1: []}  # per slot: tokens, then the logits returned
    got: dict[int, list[torch.Tensor]] = {0: [], 1: []}
    with CaptureAudit() as audit, torch.inference_mode():
        for chunks in steps:
            logits = packed.forward(chunks).logits
            torch.testing.assert_close(padded.forward(chunks).logits, logits, atol=1e-5, rtol=1e-4)
            at = 0
            for c in chunks:
                fed[c.slot].append(c.input_ids)
                got[c.slot].append(logits[at : at + len(c.input_ids)])
                at += len(c.input_ids)
        for slot in (0, 1):
            alone = model(torch.cat(fed[slot])[None]).logits[0]
            torch.testing.assert_close(torch.cat(got[slot]), alone, atol=1e-5, rtol=1e-4)
    assert audit.problems == [] and (audit.captures, audit.replays) == (3, 2)
