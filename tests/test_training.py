"""Drafter training runs: a seed fixes the weights, each epoch trains on every sequence once, and a
run interrupted and resumed from its checkpoint ends where the uninterrupted run ends."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from trtspec.errors import TrtspecError
from trtspec.train import dflash, dspark, eagle3

# one length: the target regenerates them in one batch
PROMPTS = ["def f(x)", "Q: 1 + 3", "import o", "class A:", "Q: 7 * 8", "for i in", "x = [1, ", "Q: 90-9"]
# 8 sequences, 2 a step, 2 epochs: 8 steps in all; the runs stop at 5, checkpointing every 2
RECIPES = {
    "dflash": (dflash.train_dflash, lambda: dflash.DFlashTrainConfig(
        block_size=4, num_layers=1, target_layer_ids=[2], response_tokens=12, anchors_per_seq=3,
        batch_size=2, epochs=2, max_steps=5, checkpoint_every=2)),
    "dspark": (dspark.train_dspark, lambda: dspark.DSparkTrainConfig(
        block_size=3, num_layers=1, target_layer_ids=[2], markov_rank=8, response_tokens=12,
        anchors_per_seq=3, batch_size=2, epochs=2, max_steps=5, checkpoint_every=2)),
    "eagle3": (eagle3.train_eagle3, lambda: eagle3.Eagle3TrainConfig(
        ttt_steps=2, aux_layer_ids=[0, 1, 2], response_tokens=12, batch_size=2, epochs=2, max_steps=5,
        checkpoint_every=2)),
}


class Interrupted(Exception):
    pass


def _train(method, target_dir, prompts, out, data=None):
    """One run into `out`; `data`: an earlier run's regenerated continuations, to skip regenerating."""
    if data is not None and not (out / "checkpoint").is_dir():
        (out / "checkpoint").mkdir(parents=True)
        shutil.copy(data, out / "checkpoint" / "data.pt")
    train, cfg = RECIPES[method]
    return train(target_dir, prompts, out, cfg())


def _weights(out):
    return load_file(out / "model.safetensors")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_a_resumed_run_ends_where_the_uninterrupted_run_ends(method, random_qwen3_dir, prompts, tmp_path,
                                                             monkeypatch):
    """EAGLE-3 read --max-steps as steps to train in THIS run, so an interrupted run resumed with
    the same command trained past the step it was asked to stop at (resumed at 2 of `--max-steps
    5`: on to step 7, weights unlike the uninterrupted run's). A run killed between checkpoints
    writes no training.json, so the resumed run's report lost the history before the resume
    ([4, 5] for [2, 4, 5]). Equal weights also say that the seed fixes them."""
    whole = _train(method, random_qwen3_dir, prompts, tmp_path / "whole")
    data = tmp_path / "whole" / "checkpoint" / "data.pt"
    expected = _weights(tmp_path / "whole")

    module = {"dflash": dflash, "dspark": dspark, "eagle3": eagle3}[method]
    lr_at = module._lr_at

    def stop_at_step_3(step, total, cfg):  # killed before step 3 trains; the checkpoint is at step 2
        if step == 3:
            raise Interrupted
        return lr_at(step, total, cfg)

    monkeypatch.setattr(module, "_lr_at", stop_at_step_3)
    with pytest.raises(Interrupted):
        _train(method, random_qwen3_dir, prompts, tmp_path / "resumed", data)
    monkeypatch.setattr(module, "_lr_at", lr_at)
    resumed = _train(method, random_qwen3_dir, prompts, tmp_path / "resumed")
    got = _weights(tmp_path / "resumed")
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(w, expected[k]) for k, w in got.items())
    assert [h["step"] for h in resumed["history"]] == [2, 4, 5]
    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in whole["history"]]
    # 5 steps of 2 of the 8 sequences: epoch 0 done, 2 of epoch 1 taken
    order = torch.load(tmp_path / "resumed" / "checkpoint" / "state.pt")["order"]
    assert (order["epoch"], order["position"]) == (1, 2)


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_a_run_interrupted_while_it_saves_its_last_step_reruns_to_the_same_drafter(
        method, random_qwen3_dir, prompts, tmp_path, monkeypatch):
    """The resumable state was saved before the drafter: Ctrl-C while the last step's drafter was
    written left checkpoint/state.pt at the last step beside no model.safetensors (or an earlier
    checkpoint's), and the rerun refused with "already trained 5 steps ... nothing to train". The
    drafter is now saved first, so the state never runs ahead of it."""
    whole = _train(method, random_qwen3_dir, prompts, tmp_path / "whole")
    module = {"dflash": dflash, "dspark": dspark, "eagle3": eagle3}[method]
    name = f"save_{method}"
    save, saves = getattr(module, name), []

    def interrupted_at_the_last_step(model, out_dir, *args):
        saves.append(out_dir)
        if len(saves) == 3:  # steps 2, 4 and 5 are saved
            raise Interrupted
        save(model, out_dir, *args)

    monkeypatch.setattr(module, name, interrupted_at_the_last_step)
    with pytest.raises(Interrupted):
        _train(method, random_qwen3_dir, prompts, tmp_path / "o", data=tmp_path / "whole/checkpoint/data.pt")
    monkeypatch.setattr(module, name, save)
    resumed = _train(method, random_qwen3_dir, prompts, tmp_path / "o")
    assert [h["step"] for h in resumed["history"]] == [h["step"] for h in whole["history"]]
    expected, got = _weights(tmp_path / "whole"), _weights(tmp_path / "o")
    assert all(torch.equal(w, expected[k]) for k, w in got.items())


def _rows_seen(method, monkeypatch) -> list[torch.Tensor]:
    """Spy on the recipe's loss input: the batches' sequences, in the order it trains on them."""
    module = {"dflash": dflash, "dspark": dspark, "eagle3": eagle3}[method]
    name, seqs_at = {"dflash": ("dflash_loss", 3), "dspark": ("block_forward", 1),
                     "eagle3": ("eagle3_ttt_loss", 1)}[method]
    real, seen = getattr(module, name), []

    def spy(*args, **kwargs):
        seen.append(args[seqs_at].clone())  # [b, width]
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return seen


@pytest.mark.parametrize("method", sorted(RECIPES))
def test_every_sequence_is_trained_on_once_per_epoch(method, random_qwen3_dir, prompts, tmp_path,
                                                     monkeypatch):
    """Each step drew its batch at random with replacement (`torch.randint`), so an epoch saw some
    sequences twice and others never: 2 epochs of 8 sequences at 2 a step trained on 5 distinct
    ones in each epoch (DFlash and DSpark, seed 0; EAGLE-3 on 5, then 8). Epoch-based trainers
    shuffle once per epoch and walk the order; so does the recipe now, a fresh order each epoch,
    saved with the checkpoint."""
    seen = _rows_seen(method, monkeypatch)
    train, cfg = RECIPES[method]
    train(random_qwen3_dir, prompts, tmp_path / "o", cfg().model_copy(update={"max_steps": None}))
    data = torch.load(tmp_path / "o" / "checkpoint" / "data.pt")
    batches = torch.cat(seen)  # [steps * b, width]
    ids = [next(i for i, s in enumerate(data["seqs"]) if torch.equal(s[: len(row)], row)) for row in batches]
    num = len(PROMPTS)
    assert len(ids) == 2 * num  # 2 epochs
    epochs = [ids[:num], ids[num:]]
    assert [sorted(e) for e in epochs] == [list(range(num))] * 2
    assert epochs[0] != epochs[1]  # reshuffled, not one order twice
    order = torch.load(tmp_path / "o" / "checkpoint" / "state.pt")["order"]
    assert (order["epoch"], order["position"]) == (1, num) and order["order"].tolist() == epochs[1]


def test_a_run_refused_before_its_first_step_reruns_with_the_options_its_error_asks_for(
        random_qwen3_dir, prompts, tmp_path):
    """Responses too short for one block are refused with 'raise --response-tokens'; the rerun
    that did so was refused in turn, because the first run had cached its continuations
    (checkpoint/data.pt) for the old --response-tokens. With no training step on that cache it
    is regenerated; with one (state.pt) it is still refused, as resuming on new data would be."""
    out = tmp_path / "o"
    short = dflash.DFlashTrainConfig(block_size=16, num_layers=1, target_layer_ids=[2], response_tokens=8,
                                     batch_size=2, max_steps=1)
    with pytest.raises(TrtspecError, match="raise --response-tokens"):
        dflash.train_dflash(random_qwen3_dir, prompts, out, short)
    assert not (out / "checkpoint" / "state.pt").exists()
    longer = short.model_copy(update={"response_tokens": 24})
    report = dflash.train_dflash(random_qwen3_dir, prompts, out, longer)
    assert [h["step"] for h in report["history"]] == [1]
    assert torch.load(out / "checkpoint" / "data.pt")["source"]["response_tokens"] == 24
    again = longer.model_copy(update={"response_tokens": 32, "max_steps": 2})
    with pytest.raises(TrtspecError, match="--response-tokens was 24"):
        dflash.train_dflash(random_qwen3_dir, prompts, out, again)


def test_prompts_longer_than_the_target_s_context_are_refused_naming_the_prompt(random_qwen3_dir, tmp_path):
    """A prompt whose continuation runs past max_position_embeddings (512 here) was trained on:
    positions the target never learnt and the server refuses (a 5,000-byte prompt on the tiny
    target, 4,096 positions, trained without a word). Refused before regenerating, naming the
    file, the prompt and the numbers; nothing is written."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "x = 1"}) + "\n" + json.dumps({"prompt": "y" * 500}) + "\n")
    cfg = dflash.DFlashTrainConfig(block_size=4, num_layers=1, target_layer_ids=[2], response_tokens=16,
                                   max_steps=1)
    with pytest.raises(TrtspecError) as error:
        dflash.train_dflash(random_qwen3_dir, prompts, tmp_path / "o", cfg)
    assert str(error.value).startswith(f"{prompts}: prompt 2 is 500 tokens, and with --response-tokens 16 "
                                       "needs 516 positions, more than the target's max_position_embeddings")
    assert "max_position_embeddings 512 (" in str(error.value)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_anchors_reach_the_last_tokens_of_a_response(method, random_qwen3_dir, prompts, tmp_path,
                                                     monkeypatch):
    """A block had to fit whole in the response, so no anchor fell in its last B−1 tokens: the
    drafter never drafted a response's end (EOS at slot 1 was never a label). Like SpecForge and
    DeepSpec, anchors now run to the second-to-last token and the labels past the end are masked."""
    module = dflash if method == "dflash" else dspark
    seen = []

    def spy(rows, *args, **kwargs):  # records what the recipe draws
        anchors = sample_anchors(rows, *args, **kwargs)
        seen.append((rows, anchors))
        return anchors

    sample_anchors = module.sample_anchors
    monkeypatch.setattr(module, "sample_anchors", spy)
    _train(method, random_qwen3_dir, prompts, tmp_path / "o")
    data = torch.load(tmp_path / "o" / "checkpoint" / "data.pt")
    block = RECIPES[method][1]().block_size
    last = torch.cat([data["lens"][rows, None] - 1 - anchors for rows, anchors in seen])  # tokens after it
    assert last.min() == 1 and (last < block - 1).any()


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_a_drafter_deeper_than_its_target_starts_the_extra_layers_at_random(method, random_qwen3_dir):
    """`--layers 8` on the 6-layer tiny target was an IndexError traceback, after regenerating:
    drafter layer i started from target layer i for every i. Layers past the target's depth now
    keep their random start."""
    from trtspec.models.target import load_causal_lm

    target = load_causal_lm(random_qwen3_dir)  # 3 layers
    if method == "dflash":
        model = dflash.new_drafter(target, 258, dflash.DFlashTrainConfig(num_layers=5, target_layer_ids=[2]))
    else:
        model = dspark.new_dspark(target, 258, dspark.DSparkTrainConfig(num_layers=5, target_layer_ids=[2]))
    name = "self_attn.q_proj.weight"
    for i, layer in enumerate(model.layers):
        same = torch.equal(layer.get_parameter(name), target.model.layers[min(i, 2)].get_parameter(name))
        assert same == (i < 3), i
