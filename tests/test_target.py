"""Target adapter: hidden-state taps in the same pass, rewind by a count, checkpoint checks."""

from __future__ import annotations

import pytest
import torch

from trtspec.errors import CheckpointError
from trtspec.models.target import TargetModel, load_causal_lm


@pytest.mark.parametrize("family", ["random_qwen3_dir", "random_llama_dir"])
def test_taps_equal_hidden_states_of_a_plain_forward(family, request):
    path = request.getfixturevalue(family)
    target = TargetModel.from_pretrained(path, tap_layer_ids=(0, 2))
    ids = torch.randint(0, 256, (1, 17), generator=torch.Generator().manual_seed(4))
    out = target.forward(ids[:, :10])
    out2 = target.forward(ids[:, 10:])
    with torch.no_grad():
        ref = target.model(ids, output_hidden_states=True)
    expected = torch.cat([ref.hidden_states[1], ref.hidden_states[3]], -1)  # layers 0 and 2
    got = torch.cat([out.hidden, out2.hidden], 1)
    assert got.shape == (1, 17, 2 * target.config.hidden_size)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.cat([out.logits, out2.logits], 1), ref.logits, atol=1e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("family", ["random_qwen3_dir", "random_llama_dir"])
def test_rewind_equals_cache_built_from_accepted_tokens(family, request):
    path = request.getfixturevalue(family)
    gen = torch.Generator().manual_seed(7)
    prompt = torch.randint(0, 256, (1, 12), generator=gen)
    fed = torch.randint(0, 256, (1, 6), generator=gen)  # last + 5 drafts
    num_accepted = 2

    spec = TargetModel.from_pretrained(path)
    spec.forward(prompt)
    spec.forward(fed)
    spec.rewind(fed.shape[1] - 1 - num_accepted)

    ref = TargetModel.from_pretrained(path)
    ref.forward(prompt)
    ref.forward(fed[:, : num_accepted + 1])

    assert spec.seq_len == ref.seq_len == 12 + num_accepted + 1
    for a, b in zip(spec.cache.layers, ref.cache.layers, strict=True):
        torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(a.values, b.values, atol=1e-5, rtol=1e-4)
    # and the next step sees the same logits
    nxt = torch.tensor([[42]])
    torch.testing.assert_close(spec.forward(nxt).logits, ref.forward(nxt).logits, atol=1e-5,
                               rtol=1e-4)


def test_rewind_refuses_negative_and_too_many(random_qwen3_dir):
    target = TargetModel.from_pretrained(random_qwen3_dir)
    target.forward(torch.tensor([[1, 2, 3]]))
    with pytest.raises(ValueError, match="non-negative"):
        target.rewind(-1)
    with pytest.raises(ValueError, match="cannot rewind 4"):
        target.rewind(4)


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
