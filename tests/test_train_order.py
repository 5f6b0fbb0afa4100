"""`train.order.EpochOrder`: the stream of per-epoch permutations the drafter recipes draw batches from."""

from __future__ import annotations

import pytest
import torch

from trtspec.train.order import EpochOrder


@pytest.mark.parametrize("num, batch", [(7, 3), (5, 5), (4, 9), (1, 2)])
def test_each_epoch_of_the_stream_is_a_permutation(num, batch):
    examples = torch.arange(100, 100 + num)
    order = EpochOrder(examples, torch.Generator().manual_seed(0))
    stream = torch.cat([order.take(batch) if i % 2 else order.take(0)  # a take of 0 takes nothing
                        for i in range(12 * num)]).tolist()  # [6 · num · batch]
    epochs = [stream[i : i + num] for i in range(0, len(stream), num)]
    assert all(sorted(e) == examples.tolist() for e in epochs)
    assert order.epoch * num + order.position == len(stream)


def test_a_restored_order_draws_what_the_uninterrupted_one_draws():
    gen = torch.Generator().manual_seed(3)
    whole = EpochOrder(torch.arange(10), gen)
    for _ in range(3):  # past the first epoch's end
        whole.take(4)
    state, gen_state = whole.state_dict(), gen.get_state()
    tail = [whole.take(4) for _ in range(5)]

    gen2 = torch.Generator().manual_seed(99)
    resumed = EpochOrder(torch.arange(10), gen2)
    resumed.load_state_dict(state)
    gen2.set_state(gen_state)
    assert [b.tolist() for b in (resumed.take(4) for _ in range(5))] == [b.tolist() for b in tail]


def test_an_order_of_other_examples_is_refused():
    order = EpochOrder(torch.arange(4), torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="not a permutation"):
        order.load_state_dict({"epoch": 0, "position": 1, "order": torch.tensor([0, 1, 2, 5])})


def test_a_checkpoint_without_an_order_goes_on_from_its_step_count(tmp_path):
    """Checkpoints written before the order was saved (their batches were drawn with replacement)
    still resume: without replacement from the epoch and position their step count reaches."""
    from trtspec.train.dflash import resume_order

    order = EpochOrder(torch.arange(8), torch.Generator().manual_seed(0))
    resume_order(order, {"step": 5}, tmp_path / "state.pt", batch_size=2)  # 10 of 8 per epoch taken
    assert (order.epoch, order.position) == (1, 2)
    assert sorted(order.order.tolist()) == list(range(8))
