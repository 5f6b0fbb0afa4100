"""A reasoning budget (`trtspec.spec.thinking_budget`): the forced tokens by definition at every
position of chains and trees; an answer under it ends its block after exactly `budget` tokens
unless the model ends it first; speculation (chains and trees, greedy and sampled) is the target
alone's under the same budget."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.thinking_budget import ThinkingBudget

from .conftest import REPO, assert_samples_follow_target
from .test_penalties import along_random_step

END = tuple(b"</think>")


@pytest.fixture(scope="module")
def dflash():
    return load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))


def _forced(seen: list[int], budget: ThinkingBudget) -> int | None:
    """The token the definition forces after `seen` (the answer's tokens so far): none before the
    block opens (the answer's first tokens are `start`) or once `end` occurs in it; else, with
    `budget` tokens or more inside, the end's next token."""
    if seen[: len(budget.start)] != list(budget.start):
        return None  # opening (a prefix of start) or no block
    inside = seen[len(budget.start):]
    n = len(budget.end)
    if any(tuple(inside[i:i + n]) == budget.end for i in range(len(inside) - n + 1)):
        return None
    return budget.end[min(len(inside) - budget.budget, n - 1)] if len(inside) >= budget.budget else None


@pytest.mark.parametrize("tree", [False, True])
def test_the_forced_token_at_each_position_is_the_definitions(tree):
    """Random budgets, openings and ends over a 4-token vocabulary, 200 steps: at every position of
    a chain or tree step, p keeps only the definition's forced token after the generated tokens and
    the drafts on the position's path, and is untouched elsewhere."""
    gen = torch.Generator().manual_seed(4)
    forced_somewhere = free_somewhere = 0
    for case in range(200):
        def ids(n: int) -> tuple[int, ...]:
            return tuple(torch.randint(0, 4, (n,), generator=gen).tolist())

        budget = ThinkingBudget(budget=case % 5, end=ids(1 + case % 3), start=ids(case % 3 // 2))
        generated = list(ids(case % 6))
        logits, out, paths = along_random_step(SamplingParams(thinking=budget), generated, tree, gen, 4)
        for j, path in enumerate(paths):
            token = _forced(generated + path, budget)
            expected = logits[j].clone()
            if token is not None:
                expected = torch.full_like(expected, float("-inf"))
                expected[token] = 0.0
            torch.testing.assert_close(out[j], expected)
            forced_somewhere += token is not None
            free_somewhere += token is None
    assert forced_somewhere > 100 and free_somewhere > 100


def test_a_budgets_end_is_token_ids_and_the_budget_cannot_change():
    """A block's end of no tokens, or holding a negative id anywhere in it, is refused; a budget is
    frozen (requests' SamplingParams share it) and hashable."""
    for end in ((), (-1,), (5, -1)):
        with pytest.raises(ValidationError, match="one or more token ids"):
            ThinkingBudget(budget=1, end=end)
    budget = ThinkingBudget(budget=1, end=(5, 0))
    with pytest.raises(ValidationError):
        budget.budget = 3
    same = ThinkingBudget(budget=1, end=(5, 0))
    assert hash(SamplingParams(thinking=budget)) == hash(SamplingParams(thinking=same))


def _block(ids: list[int], start: tuple[int, ...]) -> list[int]:
    """An answer's block: its tokens after the opening up to the first end (or all of them)."""
    inside = ids[len(start):]
    for i in range(len(inside)):
        if tuple(inside[i:i + len(END)]) == END:
            return inside[:i]
    return inside


@pytest.mark.parametrize("tree", [None, TreeConfig(nodes=12, topk=3)], ids=["chain", "tree"])
def test_speculation_under_a_budget_is_the_target_alones(dflash, tree):
    """Greedy, 4 prompts: under budgets of 0, 7 and 30 tokens the speculative text is the target
    alone's under the same budget; the block (the embedded model never ends one itself) holds
    exactly the budget's tokens, then </think>, then the answer goes on; an opening the answer does
    not start with budgets nothing. Drafts are still accepted."""
    plain = SpeculativeDecoder(dflash.target, None, dflash.decoder_for(1).end_ids, max_slots=4)
    spec = dflash.decoder_for(4, ScheduleConfig(mode="full"), tree=tree)
    prompts = [list(p) for p in (b"Q: 482 + 356\nA: <think>\n", b"Q: 97 * 3\nA: <think>\n",
                                 b"def parse(self, text):\n", b"import os\n")]
    free = [r.token_ids for r in plain.generate_batch([Request(p, 60) for p in prompts])]
    accepted = 0
    for budget in (0, 7, 30):
        sampling = SamplingParams(thinking=ThinkingBudget(budget=budget, end=END))
        want = [r.token_ids for r in plain.generate_batch([Request(p, 60, sampling) for p in prompts])]
        got = spec.generate_batch([Request(p, 60, sampling) for p in prompts])
        assert [r.token_ids for r in got] == want, budget
        accepted += sum(r.num_accepted for r in got)
        for ids, free_ids in zip(want, free, strict=True):
            assert ids[:budget] == free_ids[:budget] and ids[budget:budget + len(END)] == list(END)
            assert _block(ids, ()) == free_ids[:budget]
    assert accepted > 40
    unopened = SamplingParams(thinking=ThinkingBudget(budget=3, end=END, start=tuple(b"<think>")))
    assert [r.token_ids for r in spec.generate_batch([Request(p, 60, unopened) for p in prompts])] == free


def test_sampling_follows_the_budgeted_target(dflash):
    """Sampled, 16 requests a step: each position's law is the budgeted target's exact one, with an
    opening the answer takes on some paths only (a space first): those paths think one token, then
    are forced into </think>; the others are free."""
    spec = dflash.decoder_for(16, ScheduleConfig(mode="full"))
    sampling = SamplingParams(temperature=1.0, top_k=3,
                              thinking=ThinkingBudget(budget=1, end=END, start=(ord(" "),)))
    assert_samples_follow_target(dflash.target.model, spec, list(b"Q: 482 + 356\nA:"), sampling, steps=4)
