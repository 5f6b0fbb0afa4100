"""Target adapter: packed forwards over per-slot buffers equal plain forwards, taps in the same
pass, rewind is a non-negative count, checkpoint checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM, Qwen3ForCausalLM

from trtspec.errors import CheckpointError
from trtspec.models.checkpoint import check_weights_fit, read_end_ids, read_sampling_defaults, weight_shapes
from trtspec.models.cuda_graphs import TOKEN_BUCKETS
from trtspec.models.graph_audit import CaptureAudit
from trtspec.models.target import Chunk, TargetModel, load_causal_lm


def _reference(model, ids: torch.Tensor):
    with torch.no_grad():
        return model(ids[None], output_hidden_states=True)


@pytest.mark.parametrize("family", ["random_qwen3_dir", "random_llama_dir"])
def test_packed_slots_equal_plain_forwards_with_taps(family, request):
    """Three requests of unequal lengths in slots 2, 0, 3 (prefill split over two forwards, the
    second packing them with an idle slot between): logits and taps equal each request alone."""
    path = request.getfixturevalue(family)
    target = TargetModel.from_pretrained(path, tap_layer_ids=(0, 2))
    target.allocate(4, 64)
    gen = torch.Generator().manual_seed(4)
    seqs = [torch.randint(0, 256, (n,), generator=gen) for n in (17, 5, 30)]
    slots, cut = [2, 0, 3], [10, 5, 21]
    first = target.forward([Chunk(s, x[:c]) for s, x, c in zip(slots, seqs, cut, strict=True)])
    rest = [(s, x[c:]) for s, x, c in zip(slots, seqs, cut, strict=True) if c < len(x)]
    second = target.forward([Chunk(s, x) for s, x in rest])
    starts1, starts2 = [0, 10, 15], [0, 7]
    for i, (s, x) in enumerate(zip(slots, seqs, strict=True)):
        ref = _reference(target.model, x)
        taps = torch.cat([ref.hidden_states[1][0], ref.hidden_states[3][0]], -1)  # layers 0 and 2
        c = cut[i]
        torch.testing.assert_close(first.logits[starts1[i] : starts1[i] + c], ref.logits[0, :c],
                                   atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(first.hidden[starts1[i] : starts1[i] + c], taps[:c], atol=1e-5, rtol=1e-4)
        if c < len(x):
            j = [r[0] for r in rest].index(s)
            n = len(x) - c
            torch.testing.assert_close(second.logits[starts2[j] : starts2[j] + n], ref.logits[0, c:],
                                       atol=1e-5, rtol=1e-4)
        assert target.seq_len(s) == len(x)
    assert target.seq_len(1) == 0


@pytest.mark.parametrize("family", ["random_qwen3_dir", "random_llama_dir"])
def test_rewind_equals_cache_built_from_accepted_tokens(family, request):
    path = request.getfixturevalue(family)
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 256, (12,), generator=gen)
    fed = torch.randint(0, 256, (6,), generator=gen)  # last + 5 drafts
    num_accepted = 2

    spec = TargetModel.from_pretrained(path)
    spec.allocate(2, 32)
    spec.forward([Chunk(1, prompt)])
    spec.forward([Chunk(1, fed)])
    spec.rewind(1, len(fed) - 1 - num_accepted)

    ref = TargetModel.from_pretrained(path)
    ref.allocate(1, 32)
    ref.forward([Chunk(0, prompt)])
    ref.forward([Chunk(0, fed[: num_accepted + 1])])

    n = 12 + num_accepted + 1
    assert spec.seq_len(1) == ref.seq_len(0) == n
    for a, b in zip(spec.cache.layers, ref.cache.layers, strict=True):
        torch.testing.assert_close(a.keys[1, :, :n], b.keys[0, :, :n], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(a.values[1, :, :n], b.values[0, :, :n], atol=1e-5, rtol=1e-4)
    # and the next step sees the same logits, whatever the rejected positions still hold
    nxt = torch.tensor([42, 7])
    torch.testing.assert_close(spec.forward([Chunk(1, nxt)]).logits, ref.forward([Chunk(0, nxt)]).logits,
                               atol=1e-5, rtol=1e-4)


def test_logits_at_selects_packed_positions(random_qwen3_dir):
    target = TargetModel.from_pretrained(random_qwen3_dir)
    target.allocate(2, 16)
    ids = [torch.tensor([1, 2, 3, 4]), torch.tensor([5, 6])]
    full = target.forward([Chunk(0, ids[0]), Chunk(1, ids[1])]).logits  # [6, V]
    target.reset()
    picked = target.forward([Chunk(0, ids[0]), Chunk(1, ids[1])], logits_at=torch.tensor([3, 5])).logits
    torch.testing.assert_close(picked, full[[3, 5]])


def test_rewind_and_capacity_refusals(random_qwen3_dir):
    target = TargetModel.from_pretrained(random_qwen3_dir)
    with pytest.raises(RuntimeError, match="allocate"):
        target.forward([Chunk(0, torch.tensor([1]))])
    target.allocate(1, 4)
    target.forward([Chunk(0, torch.tensor([1, 2, 3]))])
    with pytest.raises(ValueError, match="cannot rewind -1"):
        target.rewind(0, -1)
    with pytest.raises(ValueError, match="cannot rewind 4"):
        target.rewind(0, 4)
    with pytest.raises(ValueError, match="would hold 5 positions; its capacity is 4"):
        target.forward([Chunk(0, torch.tensor([4, 5]))])


def test_model_still_serves_plain_calls(random_qwen3_dir):
    """The slot attention implementation falls back to SDPA for ordinary calls (generate, training)."""
    model = load_causal_lm(random_qwen3_dir)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before = model(ids).logits
    TargetModel(model)
    with torch.no_grad():
        after = model(ids).logits
        generated = model.generate(ids, do_sample=False, max_new_tokens=4, pad_token_id=0)
    torch.testing.assert_close(after, before)
    assert generated.shape == (1, 9)


def test_tap_layer_out_of_range(random_qwen3_dir):
    model = load_causal_lm(random_qwen3_dir)
    with pytest.raises(ValueError, match="tap layer 3 is out of range"):
        TargetModel(model, (3,))


def test_checkpoint_without_weights(tmp_path, random_qwen3_dir):
    (tmp_path / "config.json").write_text((random_qwen3_dir / "config.json").read_text())
    with pytest.raises(CheckpointError, match="has no weights"):
        load_causal_lm(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_causal_lm(tmp_path / "nope")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_causal_lm(tmp_path)


def test_a_missing_or_torn_weight_file_is_named(tmp_path, random_qwen3_dir):
    """Sharded safetensors and PyTorch's `.bin` weights (whole and sharded) load; a shard its index
    lists but the folder lacks, an index that is not one, and a `.bin` cut short are each named. They
    were "config.json describes a model of 182,208 parameters but the weights hold 161,664" and
    "config.json: the target does not build from it: PytorchStreamReader failed …" (found fuzzing
    checkpoint formats, 2026-12-06)."""
    model = Qwen3ForCausalLM.from_pretrained(random_qwen3_dir)
    state = {name: t.contiguous() for name, t in model.state_dict().items()}
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        want = model(ids).logits

    def folder(name: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text((random_qwen3_dir / "config.json").read_text())
        return path

    sharded = folder("sharded")
    model.save_pretrained(sharded, max_shard_size="100KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3
    bins = folder("bins")
    names = sorted(state)
    halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, keys in halves.items():
        torch.save({k: state[k] for k in keys}, bins / file)
    weight_map = {k: file for file, keys in halves.items() for k in keys}
    (bins / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    single = folder("single")
    torch.save(state, single / "pytorch_model.bin")
    for path in (sharded, bins, single):
        with torch.no_grad():
            torch.testing.assert_close(load_causal_lm(path)(ids).logits, want)

    (sharded / shards[1]).unlink()
    with pytest.raises(CheckpointError) as missing:
        load_causal_lm(sharded)
    says = f"{sharded / shards[1]} is missing: model.safetensors.index.json lists it"
    assert str(missing.value).startswith(says)
    for text in ('{"weight_map": ', json.dumps({"weight_map": index["weight_map"]})):  # no JSON, no metadata
        (sharded / "model.safetensors.index.json").write_text(text)
        with pytest.raises(CheckpointError, match="model.safetensors.index.json: not a weight index"):
            load_causal_lm(sharded)
    (bins / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(CheckpointError, match="pytorch_model-00002-of-00002.bin is missing"):
        load_causal_lm(bins)
    torn = single / "pytorch_model.bin"
    torn.write_bytes(torn.read_bytes()[:20_000])
    with pytest.raises(CheckpointError) as cut:
        load_causal_lm(single)
    assert str(cut.value).startswith(f"{torn}: a weight file cannot be read") and "\n" not in str(cut.value)
    # beside safetensors, transformers loads those: a Hub repo of both formats downloaded without its
    # .bin files (their index kept), or with Git LFS pointers in their place, loads
    model.save_pretrained(both := folder("both"))
    (both / "pytorch_model.bin.index.json").write_text((bins / "pytorch_model.bin.index.json").read_text())
    (both / "pytorch_model.bin").write_text("version https://git-lfs.github.com/spec/v1\n")
    (both / "model.safetensors.index.json").write_text(json.dumps(index))  # stale: model.safetensors wins
    with torch.no_grad():
        torch.testing.assert_close(load_causal_lm(both)(ids).logits, want)
    # a stray consolidated.safetensors (Mistral's repos) is not what transformers reads: the .bin shards
    # are, and one missing is named
    (bins / "consolidated.safetensors").write_bytes((both / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match="pytorch_model-00002-of-00002.bin is missing"):
        load_causal_lm(bins)
    (sharded / "model.safetensors.index.json").unlink()  # shards without their index
    with pytest.raises(CheckpointError, match="model-00001-of-.* but no model.safetensors or pytorch_model"):
        load_causal_lm(sharded)
    (bins / "pytorch_model.bin.index.json").unlink()
    with pytest.raises(CheckpointError, match="pytorch_model-00001-of-00002.bin but no model.safetensors"):
        load_causal_lm(bins)
    # a stray safetensors shard beside a whole pytorch_model.bin: transformers reads the .bin, and
    # the shard's tensors are not held against config.json (they were: "weights hold 3,392")
    torch.save(state, single / "pytorch_model.bin")
    (single / shards[0]).write_bytes((sharded / shards[0]).read_bytes())
    with torch.no_grad():
        torch.testing.assert_close(load_causal_lm(single)(ids).logits, want)


def test_bin_weights_are_held_against_config_json_before_loading(tmp_path, random_llama_dir, capfd):
    """PyTorch `.bin` weights are checked against config.json before anything loads, as safetensors
    are (their shapes read from the file mapped): a tensor missing, a vocabulary config.json gets
    wrong (tied embeddings: it was transformers' "aten::equal ... Meta tensors" error), a file that
    holds no state dict (it was "config.json: the target does not build from it: dictionary update
    sequence ..."); and a dtype torch has no name for is refused naming config.json's field (it
    named no field). Each one line, without transformers' load report (found fuzzing checkpoint
    formats, 2026-12-06)."""
    config = json.loads((random_llama_dir / "config.json").read_text())
    model = LlamaForCausalLM.from_pretrained(random_llama_dir)
    state = {name: t.contiguous() for name, t in model.state_dict().items()}

    def folder(name: str, weights, **changes) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config | changes))
        torch.save(weights, path / "pytorch_model.bin")
        return path

    whole = folder("whole", state)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    per_module = folder("per_module", state, dtype={"": "float32"})  # transformers reads a mapping too
    with torch.no_grad():
        for path in (whole, per_module):
            torch.testing.assert_close(load_causal_lm(path)(ids).logits, model(ids).logits)
    capfd.readouterr()
    lacking = {k: t for k, t in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    tied = {k: t for k, t in state.items() if k != "lm_head.weight"}
    cases = {
        folder("lacking", lacking): "config.json describes a model of .* but the weights hold",
        folder("vocab", tied, tie_word_embeddings=True, vocab_size=config["vocab_size"] + 13):
            r"model.embed_tokens.weight is \[264, 64\] in the weights, \[277, 64\] by config.json",
        folder("listed", list(state.values())): "pytorch_model.bin: holds a list, not a state dict",
        folder("float7", state, dtype="float7"): "config.json: dtype 'float7' is not a torch dtype",
        folder("auto", state, torch_dtype="auto"): "config.json: torch_dtype 'auto' is not a torch dtype",
    }
    for path, says in cases.items():
        with pytest.raises(CheckpointError, match=says) as refused:
            load_causal_lm(path)
        assert str(refused.value).startswith(str(path)) and "\n" not in str(refused.value)
    printed = capfd.readouterr()
    assert "LOAD REPORT" not in printed.out + printed.err


class _MakesADirectory:
    """An object whose unpickling runs code: os.mkdir(path)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (str(self.path),)


def test_a_bin_s_pickle_runs_no_code_when_its_shapes_are_read(tmp_path):
    """`weight_shapes` reads a PyTorch `.bin` for weights only: a pickle that would run code as it
    loads (here os.mkdir) is refused as a weight file that cannot be read, and nothing of it runs."""
    ran = tmp_path / "ran"
    file = tmp_path / "pytorch_model.bin"
    torch.save({"w": torch.zeros(2, 3), "x": _MakesADirectory(ran)}, file)
    with pytest.raises(CheckpointError, match="a weight file cannot be read"):
        weight_shapes([file])
    assert not ran.exists()


def test_every_parameter_the_weights_lack_counts_but_the_shared_ones(tmp_path):
    """`check_weights_fit` refuses weights that lack even one parameter of a single element (a bias
    of one output), and takes weights that lack only the `shared` ones (a drafter's borrowed
    embeddings)."""
    def build():
        return torch.nn.Linear(2, 1)

    check_weights_fit(build, {"weight": (1, 2), "bias": (1,)}, tmp_path)
    with pytest.raises(CheckpointError, match="describes a model of 3 parameters but the weights hold 2"):
        check_weights_fit(build, {"weight": (1, 2)}, tmp_path)
    check_weights_fit(build, {"bias": (1,)}, tmp_path, shared=2)


def _packed_and_padded(path, num_slots: int, capacity: int):
    """One target twice, packed and padded for CUDA graphs (taps of layers 0 and 2), allocated; and
    `both(chunks)`, which feeds the two and checks that their logits and taps agree."""
    packed = TargetModel.from_pretrained(path, tap_layer_ids=(0, 2))
    padded = TargetModel(packed.model, (0, 2), cuda_graphs=True)
    for t in (packed, padded):
        t.allocate(num_slots, capacity)

    def both(chunks, logits_at=None):
        a, b = packed.forward(chunks, logits_at), padded.forward(chunks, logits_at)
        torch.testing.assert_close(b.logits, a.logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(b.hidden, a.hidden, atol=1e-5, rtol=1e-4)

    return packed, padded, both


@pytest.mark.parametrize("family", ["random_qwen3_dir", "random_llama_dir"])
def test_steps_padded_for_cuda_graphs_equal_the_packed_forward(family, request):
    """`cuda_graphs`: decode steps padded to (batch bucket, fed tokens, context bucket) and run as
    one static attention group (replayed as graphs on CUDA, eagerly here) give the packed
    forward's logits and taps: requests in slots 0, 1 and 3 with slot 2 free, steps feeding some
    of them (the others' caches stay intact), chains of random lengths, random rewinds; prefills
    and chains past MAX_TOKENS run packed."""
    packed, padded, both = _packed_and_padded(request.getfixturevalue(family), 4, 400)
    gen = torch.Generator().manual_seed(11)

    def rand(n):
        return torch.randint(0, 256, (n,), generator=gen)

    both([Chunk(s, rand(int(torch.randint(20, 60, (1,), generator=gen)))) for s in (0, 1, 3)])
    assert padded.graphed.num_steps == 0  # a prefill of 20+ tokens: packed
    shapes = set()
    for _ in range(8):
        fed = [s for s in (3, 0, 1) if torch.rand(1, generator=gen) < 0.7] or [1]
        chunks = [Chunk(s, rand(int(torch.randint(1, 18, (1,), generator=gen)))) for s in fed]
        total = sum(len(c.input_ids) for c in chunks)
        both(chunks, torch.randperm(total, generator=gen)[: total // 2])
        bucket = 4 if 3 in fed else 2 if 1 in fed else 1  # a power of two past the highest slot fed
        longest = max(len(c.input_ids) for c in chunks)
        shapes.add((bucket, next(n for n in TOKEN_BUCKETS if n >= longest), 256, False))
        for c in chunks:
            back = int(torch.randint(0, len(c.input_ids), (1,), generator=gen))
            packed.rewind(c.slot, back)
            padded.rewind(c.slot, back)
    assert padded.graphed.num_steps == 8
    assert set(padded.graphed.graphs) == shapes
    both([Chunk(0, rand(40))])  # longer than MAX_TOKENS: packed
    assert padded.graphed.num_steps == 8
    assert padded.seq_len(0) == packed.seq_len(0) and padded.seq_len(2) == 0


def _random_tree(n: int, gen: torch.Generator) -> tuple[int, ...]:
    """Parents of n nodes: node 0 the root, each later one under a random earlier one."""
    return (-1, *(int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)))


def test_tree_steps_padded_for_cuda_graphs_equal_the_packed_forward(random_qwen3_dir):
    """Draft trees in padded steps (the tree's shape is data, so trees of any shape share a graph):
    a target verifying trees in slots 0 and 3 beside a chain in slot 1, each tree's accepted path
    kept (`keep_paths`), and a tree fed depth by depth (a later forward's nodes see ancestors of an
    earlier one, the span past MAX_TOKENS nodes) give the packed forward's logits and taps."""
    from trtspec.models.cuda_graphs import MAX_TOKENS
    from trtspec.models.target import PathKeep

    packed, padded, both = _packed_and_padded(random_qwen3_dir, 4, 400)
    gen = torch.Generator().manual_seed(23)

    def rand(n):
        return torch.randint(0, 256, (n,), generator=gen)

    both([Chunk(s, rand(40 + 7 * s)) for s in (0, 1, 3)])  # prefills: packed
    for _ in range(5):
        trees = {s: _random_tree(int(torch.randint(2, 20, (1,), generator=gen)), gen) for s in (0, 3)}
        starts = {s: packed.seq_len(s) for s in trees}
        chain = rand(int(torch.randint(1, 5, (1,), generator=gen)))
        both([Chunk(0, rand(len(trees[0])), trees[0]), Chunk(1, chain),
              Chunk(3, rand(len(trees[3])), trees[3])])
        keeps = []
        for s, parents in trees.items():  # a random node's root path is the accepted one
            path, node = [], int(torch.randint(0, len(parents), (1,), generator=gen))
            while node >= 0:
                path.insert(0, node)
                node = parents[node]
            keeps.append(PathKeep(s, starts[s], path))
        for t in (packed, padded):
            t.keep_paths(keeps)
            t.rewind(1, 1)
    deep = _random_tree(MAX_TOKENS + 8, gen)  # fed as 3 forwards: nodes 0..15, 16..31, 32..39
    start = packed.seq_len(0)
    for a, b in ((0, 16), (16, 32), (32, MAX_TOKENS + 8)):
        both([Chunk(0, rand(b - a), deep[:b], tree_start=start)])
    assert padded.graphed.num_steps == 8 and all(trees for *_, trees in padded.graphed.graphs)


def test_padded_steps_refuse_what_a_static_shape_cannot_hold(random_qwen3_dir, monkeypatch):
    """The graph plan is None (eager) for a tree past TREE_WINDOW nodes or a segment outside its
    tree, a chain past MAX_TOKENS and a slot fed twice; otherwise (B, n, K, trees): the batch bucket
    past the highest slot (at most the slot count), the longest chain's token bucket, the context
    bucket past the real tokens (at most the capacity), whether a row holds tree nodes. Past
    MAX_GRAPHS shapes the least recently used graph goes."""
    from trtspec.models import cuda_graphs
    from trtspec.models.cuda_graphs import MAX_TOKENS, TREE_WINDOW
    from trtspec.models.kv_slots import Segment, TreeSpan

    target = TargetModel.from_pretrained(random_qwen3_dir, cuda_graphs=True)
    target.allocate(6, 300)
    plan = target.graphed.plan
    assert plan([Segment(2, 10, 3)]) == (4, 3, 256, False)
    assert plan([Segment(0, 270, 5), Segment(4, 10, 1)]) == (6, 6, 300, False)  # 5 tokens: bucket 6
    assert plan([Segment(1, 296, 4)]) == (2, 4, 300, False)
    assert plan([Segment(0, 254, 4)]) == (1, 4, 300, False)  # its last tokens past MIN_CONTEXT
    assert plan([Segment(0, 10, MAX_TOKENS)]) == (1, MAX_TOKENS, 256, False)  # the longest chain padded
    assert plan([]) is None
    assert plan([Segment(0, 10, 3, TreeSpan(10, (-1, 0, 0))), Segment(1, 5, 1)]) == (2, 3, 256, True)
    wide = tuple([-1] + [0] * (TREE_WINDOW - 1))  # TREE_WINDOW nodes; their last 8 fed
    assert plan([Segment(0, 10 + TREE_WINDOW - 8, 8, TreeSpan(10, wide))]) == (1, 8, 256, True)
    assert plan([Segment(0, 10 + TREE_WINDOW - 7, 8, TreeSpan(10, (*wide, 0)))]) is None
    assert plan([Segment(0, 12, 3, TreeSpan(10, (-1, 0, 0)))]) is None  # past its tree's end
    assert plan([Segment(0, 10, MAX_TOKENS + 1)]) is None
    assert plan([Segment(0, 10, 2), Segment(0, 12, 1)]) is None
    target.lengths = {0: 10}
    monkeypatch.setattr(cuda_graphs, "MAX_GRAPHS", 2)
    for n in (1, 2, 1, 3):
        target.forward([Chunk(0, torch.zeros(n, dtype=torch.long))])
        target.rewind(0, n)
    # (1, 2, 256) least recently used
    assert list(target.graphed.graphs) == [(1, 1, 256, False), (1, 3, 256, False)]


def test_graphs_keep_at_most_their_output_budget(random_qwen3_dir, monkeypatch):
    """Each graph keeps its own output buffers (a target's: the logits of B·n tokens), so past
    OUTPUT_BUDGET bytes of them the least recently used graphs go, never the one just run even
    when it alone is over; the logits read out are the packed forward's either way."""
    from trtspec.models import cuda_graphs

    packed = TargetModel.from_pretrained(random_qwen3_dir)
    padded = TargetModel(packed.model, cuda_graphs=True)
    for t in (packed, padded):
        t.allocate(1, 300)
    token_bytes = padded.vocab_size * packed.model.dtype.itemsize  # one padded token's logits
    monkeypatch.setattr(cuda_graphs, "OUTPUT_BUDGET", 6 * token_bytes)  # [1, 2, 3]: at it, kept
    gen = torch.Generator().manual_seed(11)
    kept = []
    for n in (1, 2, 3, 2, 4, 8):  # buckets 1, 2, 3, 2, 4, 8 tokens
        chunk = [Chunk(0, torch.randint(0, 256, (n,), generator=gen))]
        torch.testing.assert_close(padded.forward(chunk).logits, packed.forward(chunk).logits,
                                   atol=1e-5, rtol=1e-4)
        for t in (packed, padded):
            t.rewind(0, n)
        kept.append([s[1] for s in padded.graphed.graphs])
        assert padded.graphed.output_bytes <= max(6, n) * token_bytes
    assert kept == [[1], [1, 2], [1, 2, 3], [1, 3, 2], [2, 4], [8]]


def test_kv_check_sets_the_cuda_graphs_outputs_aside(tiny_target_dir, monkeypatch):
    """`check_buffers` counts OUTPUT_BUDGET for each model that replays graphs, so K/V slots
    that fit alone but not beside the graphs' outputs are refused, naming cuda_graphs."""
    from trtspec import pipeline as pipeline_module
    from trtspec.config import BuildConfig
    from trtspec.errors import ConfigError
    from trtspec.memory import free_bytes

    config = BuildConfig.model_validate({"name": "t", "target": {"path": str(tiny_target_dir)},
                                         "limits": {"max_input_tokens": 64, "max_tokens": 64}})
    pipeline = pipeline_module.load_pipeline(config)
    pipeline.check_buffers(8)  # no graphs on the CPU: 8 slots of 128 positions fit
    free = free_bytes(pipeline.target.device)
    monkeypatch.setattr(pipeline_module, "OUTPUT_BUDGET", int(free * 0.6))  # margins: other processes
    pipeline.check_buffers(8)  # graphs off: the budget is not counted
    pipeline.target.cuda_graphs = True
    pipeline.check_buffers(8)  # one graphed model: 60 % of the free memory and a few K/V buffers
    pipeline.drafter.cuda_graphs = True
    with pytest.raises(ConfigError, match="CUDA graphs' outputs.*cuda_graphs: false"):
        pipeline.check_buffers(8)


def test_a_failed_capture_leaves_decoding_exact_and_eager(random_qwen3_dir):
    """A capture that fails (here: no CUDA at all) is logged once; that step runs the padded
    forward eagerly and every later step the packed one, with the same logits."""
    packed = TargetModel.from_pretrained(random_qwen3_dir)
    padded = TargetModel(packed.model, cuda_graphs=True)
    for t in (packed, padded):
        t.allocate(2, 128)
    padded.graphed.capture = True  # as on a CUDA device
    gen = torch.Generator().manual_seed(5)
    for n in (20, 3, 1, 4):
        chunks = [Chunk(s, torch.randint(0, 256, (n,), generator=gen)) for s in (0, 1)]
        torch.testing.assert_close(padded.forward(chunks).logits, packed.forward(chunks).logits,
                                   atol=1e-5, rtol=1e-4)
    assert padded.graphed.failed and not padded.graphed.graphs
    assert padded.graphed.num_steps == 1  # the step whose capture failed; the next two ran packed


def test_taps_hook_only_the_tapped_layers_once_per_model(random_qwen3_dir):
    """Two TargetModels with the same taps over one model share one set of hooks, on the tapped
    layers alone (the last layer's tap on the final norm); a TargetModel without taps over the same
    weights catches nothing, and the tapped one's taps equal transformers' hidden_states."""
    model = load_causal_lm(random_qwen3_dir)
    last = model.config.num_hidden_layers - 1
    a, b = TargetModel(model, (0, last)), TargetModel(model, (0, last))
    plain = TargetModel(model)
    assert a.taps is b.taps and plain.taps is None
    hooked = [name for name, m in model.named_modules() if m._forward_hooks]
    assert hooked == ["model.layers.0", "model.norm"]
    ids = torch.randint(0, 256, (11,), generator=torch.Generator().manual_seed(7))
    for t in (a, plain):
        t.allocate(1, 32)
    assert plain.forward([Chunk(0, ids)]).hidden is None
    ref = _reference(model, ids)
    torch.testing.assert_close(a.forward([Chunk(0, ids)]).hidden,
                               torch.cat([ref.hidden_states[1][0], ref.hidden_states[last + 1][0]], -1),
                               atol=1e-5, rtol=1e-4)


def _sliding_model(model_type: str):
    """A random model whose layers slide over 8 positions: Mistral (every layer), Qwen3 with
    use_sliding_window past layer 0 (layer 0 full, layers 1-2 sliding)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    extra = {"mistral": {}, "qwen3": dict(use_sliding_window=True, max_window_layers=1)}[model_type]
    config = AutoConfig.for_model(model_type, vocab_size=264, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=16, max_position_embeddings=512, sliding_window=8, **extra)
    torch.manual_seed(13)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", ["mistral", "qwen3"])
def test_sliding_window_layers_attend_within_their_window(model_type):
    """A target with sliding-window layers (transformers' rule: position p sees p - 8 < j <= p)
    gives the logits of the model's own forward, packed and padded for CUDA graphs: a prefill past
    the window in two chunks, chain steps, and a draft tree whose nodes see the window of their
    path (each node's logits are those of its root path appended to the context)."""
    model = _sliding_model(model_type)
    packed = TargetModel(model)
    padded = TargetModel(model, cuda_graphs=True)
    assert packed.sliding_window == 8
    for t in (packed, padded):
        t.allocate(2, 128)
    gen = torch.Generator().manual_seed(6)
    seq = torch.randint(0, 256, (40,), generator=gen)
    ref = _reference(model, seq).logits[0]  # [40, V]
    got = []
    parents = (-1, 0, 0, 1, 3, 2)  # the root is seq's next token; depths 0 1 1 2 3 2
    nodes = torch.randint(0, 256, (6,), generator=gen)
    with CaptureAudit() as audit:  # the padded steps as a CUDA graph would capture and replay them
        for a, b in ((0, 20), (20, 30), (30, 31), (31, 32), (32, 35), (35, 40)):
            out = [t.forward([Chunk(1, seq[a:b])]).logits for t in (packed, padded)]
            torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-4)
            got.append(out[0])
        trees = [t.forward([Chunk(1, nodes, parents)]).logits for t in (packed, padded)]
    assert audit.problems == [] and audit.replays > 0
    torch.testing.assert_close(torch.cat(got), ref, atol=1e-5, rtol=1e-4)
    assert padded.graphed.num_steps == 7  # every step fits a graph's 32 tokens a row
    torch.testing.assert_close(trees[1], trees[0], atol=1e-5, rtol=1e-4)
    for i in range(6):
        path, node = [], i
        while node >= 0:
            path.insert(0, int(nodes[node]))
            node = parents[node]
        alone = _reference(model, torch.cat([seq, torch.tensor(path)])).logits[0, -1]
        torch.testing.assert_close(trees[0][i], alone, atol=1e-5, rtol=1e-4)


def test_a_tree_as_deep_as_the_sliding_window_is_refused():
    from trtspec.config import TreeConfig
    from trtspec.models.draft_model import DraftModelDrafter
    from trtspec.spec.decoder import SpeculativeDecoder

    model = _sliding_model("mistral")
    target, drafter = TargetModel(model), DraftModelDrafter(model, 8)
    with pytest.raises(ValueError, match="drafter.tree depth 8 reaches the target's sliding window of 8"):
        SpeculativeDecoder(target, drafter, (), tree=TreeConfig(nodes=12, topk=2), capacity=64)
    SpeculativeDecoder(target, drafter, (), tree=TreeConfig(nodes=12, topk=2, depth=7), capacity=64)


def test_a_window_in_a_config_whose_attention_ignores_it_leaves_trees_alone():
    """Llama's attention reads no sliding_window (transformers attends in full whatever config.json
    says): a stray one neither windows the target nor limits a draft tree's depth."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trtspec.config import TreeConfig
    from trtspec.models.draft_model import DraftModelDrafter
    from trtspec.spec.decoder import SpeculativeDecoder

    config = AutoConfig.for_model("llama", vocab_size=264, hidden_size=64, intermediate_size=128,
                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                  max_position_embeddings=512, sliding_window=2)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config).eval()
    target = TargetModel(model)
    assert target.sliding_window is None
    target.allocate(1, 64)
    ids = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(target.forward([Chunk(0, ids)]).logits, _reference(model, ids).logits[0],
                               atol=1e-5, rtol=1e-4)  # full attention, past the stray window
    SpeculativeDecoder(target, DraftModelDrafter(model, 4), (), tree=TreeConfig(nodes=8, topk=2, depth=3),
                       capacity=64)
    assert TargetModel(_sliding_model("mistral")).sliding_window == 8  # Mistral's attention reads it


@pytest.mark.parametrize("edit,message", [
    ({"max_position_embeddings": 0}, "max_position_embeddings must be a positive number of positions, got 0"),
    ({"num_experts_per_tok": 8}, "num_experts_per_tok 8 must be in [1, num_experts 4]"),
    # transformers reads these as they are: NaN made every logit NaN, true ran as a rope_theta of 1
    ({"rms_norm_eps": float("nan")}, "rms_norm_eps must be a finite number >= 0, got nan"),
    ({"rms_norm_eps": float("inf")}, "rms_norm_eps must be a finite number >= 0, got inf"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": True}},
     "rope_parameters.rope_theta must be a finite number > 0, got True"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": float("nan")}},
     "rope_parameters.rope_theta must be a finite number > 0, got nan"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": -1}},
     "rope_parameters.rope_theta must be a finite number > 0, got -1"),
])
def test_config_values_a_forward_cannot_run_are_named_at_load(tmp_path, edit, message):
    """transformers reads both and fails at the first forward (a MoE routes each token to more
    experts than it has) or never (no positions: trtspec took it as unlimited)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("qwen3_moe", vocab_size=264, hidden_size=32, intermediate_size=64,
                                  moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  num_key_value_heads=1, head_dim=16, num_experts=4, num_experts_per_tok=2,
                                  max_position_embeddings=128)
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    assert load_causal_lm(tmp_path).config.num_experts_per_tok == 2  # the checkpoint as saved loads
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), **edit}))
    with pytest.raises(CheckpointError) as refused:
        load_causal_lm(tmp_path)
    assert str(refused.value).startswith(f"{config_file}: ") and message in str(refused.value)


def test_end_ids_come_from_config_json_where_no_generation_config_is(tmp_path, caplog):
    """As transformers makes a generation config from config.json when the checkpoint has no
    generation_config.json (and vLLM follows it): every eos id listed there ends a request; one that
    is no token of the model is left out with a warning (transformers loads such a config as it is,
    where a generation_config.json's is refused)."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [1, 646]}))
    assert read_end_ids(tmp_path, 1000) == (1, 646)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [2000, 7]}))
    with caplog.at_level("WARNING"):
        assert read_end_ids(tmp_path, 1000) == (7,)
    assert "config.json: eos_token_id [2000, 7] holds what is no token id in [0, 1000)" in caplog.text
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert read_end_ids(tmp_path, 1000) == (5,)  # a generation_config.json is read alone (transformers)
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.7}))
    assert read_end_ids(tmp_path, 1000) == ()


def test_sampling_defaults_take_every_value_a_request_could_and_refuse_the_rest(tmp_path):
    """generation_config.json's temperature, top_p and top_k are the defaults of a request that
    leaves them out, each up to its bounds (temperature 0 and 2, top_p 1, top_k 0); a value a request
    could not take (out of range, a bool, a string, top_k not an integer) is refused naming it."""
    config = tmp_path / "generation_config.json"
    assert read_sampling_defaults(tmp_path) == {}
    for given in ({"temperature": 0, "top_p": 1, "top_k": 0}, {"temperature": 2, "top_p": 0.95, "top_k": 20},
                  {"temperature": 0.6, "eos_token_id": 2}):
        config.write_text(json.dumps(given))
        assert read_sampling_defaults(tmp_path) == {k: v for k, v in given.items() if k != "eos_token_id"}
    for name, bad in (("temperature", -0.1), ("temperature", 2.5), ("temperature", True),
                      ("temperature", "0.6"), ("top_p", 0), ("top_p", 1.5), ("top_p", "1"),
                      ("top_k", -1), ("top_k", 20.5)):
        config.write_text(json.dumps({name: bad}))
        with pytest.raises(CheckpointError, match=f"{name} must be .*got {bad!r}"):
            read_sampling_defaults(tmp_path)


def test_end_ids_span_the_vocabulary_from_id_0_to_its_last(tmp_path, caplog):
    """Any id of the vocabulary may end generation, the first (0, as StarCoder's <|endoftext|>) and
    the last (vocab_size - 1) too; vocab_size itself is no token: refused in generation_config.json,
    left out of config.json's."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "eos_token_id": [0, 1000]}))
    with caplog.at_level("WARNING"):
        assert read_end_ids(tmp_path, 1000) == (0,)
    assert "config.json: eos_token_id [0, 1000] holds what is no token id in [0, 1000)" in caplog.text
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 999]}))
    assert read_end_ids(tmp_path, 1000) == (0, 999)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 1000}))
    with pytest.raises(CheckpointError, match=r"eos_token_id must be a token id .* in \[0, 1000\)"):
        read_end_ids(tmp_path, 1000)


@pytest.mark.parametrize("rope,refused", [
    ({"rope_type": "dynamic", "factor": 2.0}, True),
    ({"rope_type": "linear", "factor": 2.0}, False),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, False),
])
def test_rope_that_rescales_per_forward_is_refused_and_static_rope_serves(tmp_path, rope, refused):
    """A RoPE whose frequencies follow each forward's longest position (dynamic NTK) would rotate a
    request of a packed forward by another's length: refused by the serving target and the ONNX
    exporter alike, naming the file; a static one (fixed at load) gives the model's own logits."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from trtspec.export.target import check_exportable

    config = LlamaConfig(vocab_size=264, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_theta": 10000.0, **rope})
    torch.manual_seed(2)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    if refused:
        message = rf"{tmp_path}/config.json: rope_parameters.rope_type 'dynamic' rescales RoPE"
        with pytest.raises(CheckpointError, match=message):
            TargetModel.from_pretrained(tmp_path)
        with pytest.raises(CheckpointError, match="rope_type 'dynamic' cannot be exported"):
            check_exportable(load_causal_lm(tmp_path).config)
        return
    target = TargetModel.from_pretrained(tmp_path)
    target.allocate(1, 128)
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(8))
    want = _reference(target.model, ids).logits[0]
    torch.testing.assert_close(target.forward([Chunk(0, ids)]).logits, want, atol=1e-5, rtol=1e-4)


def test_a_forest_of_tree_window_nodes_padded_equals_the_packed_forward(random_qwen3_dir):
    """A tree of TREE_WINDOW nodes (its last node's ancestor word has bit 63 set: a negative 64-bit
    int) with several roots (a root sees the context alone, none of the other roots), fed as two
    padded forwards of MAX_TOKENS nodes, gives the packed forward's logits and taps."""
    from trtspec.models.cuda_graphs import MAX_TOKENS, TREE_WINDOW

    _, padded, both = _packed_and_padded(random_qwen3_dir, 1, 300)
    gen = torch.Generator().manual_seed(29)

    both([Chunk(0, torch.randint(0, 256, (20,), generator=gen))])  # 20 tokens: a padded chain step
    forest = (-1, -1, *(int(torch.randint(-1, i, (1,), generator=gen)) for i in range(2, TREE_WINDOW)))
    for end in range(MAX_TOKENS, TREE_WINDOW + 1, MAX_TOKENS):  # nodes 0..31, then 32..63
        both([Chunk(0, torch.randint(0, 256, (MAX_TOKENS,), generator=gen), forest[:end], tree_start=20)])
    assert padded.graphed.num_steps == 3  # every step padded, the trees too


def test_graphs_are_wanted_only_when_asked_for_and_on_a_cuda_device():
    """On the CPU the padded steps would only cost: `cuda_graphs` there leaves the models packed."""
    from trtspec.models.cuda_graphs import graphs_wanted

    assert graphs_wanted(True, torch.device("cuda")) and graphs_wanted(True, "cuda:1")
    assert not graphs_wanted(True, torch.device("cpu")) and not graphs_wanted(False, torch.device("cuda"))
