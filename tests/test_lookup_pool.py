"""The prompt lookup pool (`lookup.pool_tokens`, `trtspec.spec.lookup.LookupPool`): requests also copy
from finished requests' tokens.

Where it copies from is checked against a brute-force search over the texts a brute-force eviction
keeps. In the decoder pool copies only propose, as a request's own copies do: texts are the target
alone's (greedy and Gumbel-coupled), with copies taken from the pool and fewer target forwards than
without it, and the law of rejection-sampled answers is the target's (later requests copying earlier
ones' samples); `reset` forgets the pool. Bad fields are refused by name. TensorRT-LLM's
is_public_pool is tests/test_trtllm.py's; the served Prometheus source tests/test_lookup.py's."""

from __future__ import annotations

import random
from functools import partial

import numpy as np
import pytest
from transformers import Qwen3Config, Qwen3ForCausalLM

from trtspec.config import LookupConfig, ScheduleConfig, load_build_config
from trtspec.errors import ConfigError
from trtspec.models.target import TargetModel
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.lookup import KEY_BITS, POOL_KEY, LookupPool, PromptLookup
from trtspec.spec.sampling import SamplingParams

from .conftest import REPO, assert_samples_follow_target


def _kept(texts: list[tuple[list[int], str]], capacity: int) -> list[tuple[list[int], str]]:
    """What a pool of `capacity` tokens holds after `texts` (with their salts) were added, spelt out:
    each text and its separator cost len + 1, a text longer than capacity - 1 keeps its last
    capacity - 1 tokens, and the oldest whole texts go until the rest fit."""
    kept: list[tuple[list[int], str]] = []
    for text, salt in texts:
        text = text[len(text) - (capacity - 1):] if len(text) > capacity - 1 else text
        if not text:
            continue
        kept.append((text, salt))
        while sum(len(t) + 1 for t, _ in kept) > capacity:
            kept.pop(0)
    return kept


def _brute_force(kept: list[tuple[list[int], str]], tail: list[int], max_match: int, n: int,
                 salt: str = "") -> tuple[list[int], int]:
    """The rule, spelt out: the longest run (POOL_KEY..max_match) of tail's last tokens inside one
    kept text of `salt`; of those places, the one with the most tokens after it in its text (at most
    n), then the newest; copy what follows."""
    for run in range(min(max_match, len(tail)), POOL_KEY - 1, -1):
        places = [(min(len(text) - (s + run), n), t, s + run)
                  for t, (text, own) in enumerate(kept) if own == salt
                  for s in range(len(text) - run + 1) if text[s : s + run] == tail[len(tail) - run :]]
        if places:
            _, t, end = max(places)
            return kept[t][0][end : end + n], run
    return [], 0


SALTS = ("", "tenant-a", "tenant-b")


@pytest.mark.parametrize("seed", range(4))
def test_pool_copies_from_the_longest_match_in_the_texts_it_keeps(seed):
    """Random texts over small vocabularies, each with one of three cache salts, added to pools of
    random capacities: every proposal for random tails (some cut from the texts, so long matches
    occur) and salts is the brute-force search's, over that salt's texts only."""
    rng = random.Random(seed)
    found = 0
    for _ in range(150):
        vocab, capacity = rng.choice([2, 3, 5]), rng.randint(1, 120)
        pool, texts = LookupPool(capacity), []
        for _ in range(rng.randint(1, 6)):
            texts.append(([rng.randrange(vocab) for _ in range(rng.randint(0, 40))], rng.choice(SALTS)))
            pool.add(*texts[-1])
        kept = _kept(texts, capacity)
        assert len(pool) == sum(len(t) + 1 for t, _ in kept) <= capacity
        for _ in range(10):
            source = rng.choice(texts)[0] if rng.random() < 0.5 else []
            cut = rng.randint(0, len(source))
            tail = source[:cut] + [rng.randrange(vocab) for _ in range(rng.randint(0, 4))]
            max_match, n, salt = rng.randint(POOL_KEY, 9), rng.randint(1, 10), rng.choice(SALTS)
            got = pool.next(np.array(tail, dtype=np.int32), max_match, n, salt)
            assert got == _brute_force(kept, tail, max_match, n, salt), (kept, tail, max_match, n, salt)
            found += bool(got[0])
    assert found > 150


@pytest.mark.parametrize("seed", range(3))
def test_after_a_clear_texts_added_copy_under_their_own_salts(seed):
    """A cleared pool forgets its texts with the salts they came with: what it copies afterwards is
    the brute-force search's over the texts added since, each under its own salt."""
    rng = random.Random(seed)
    found = 0
    for _ in range(40):
        vocab, capacity = rng.choice([2, 3]), rng.randint(20, 120)
        pool = LookupPool(capacity)
        for _ in range(rng.randint(1, 4)):  # forgotten
            pool.add([rng.randrange(vocab) for _ in range(rng.randint(1, 30))], rng.choice(SALTS))
        pool.clear()
        texts = [([rng.randrange(vocab) for _ in range(rng.randint(1, 30))], rng.choice(SALTS))
                 for _ in range(rng.randint(1, 4))]
        for text, salt in texts:
            pool.add(text, salt)
        kept = _kept(texts, capacity)
        for _ in range(10):
            source = rng.choice(texts)[0]
            tail = source[: rng.randint(POOL_KEY, len(source) + POOL_KEY)]  # often a text's own run
            max_match, n, salt = rng.randint(POOL_KEY, 9), rng.randint(1, 10), rng.choice(SALTS)
            got = pool.next(np.array(tail, dtype=np.int32), max_match, n, salt)
            assert got == _brute_force(kept, tail, max_match, n, salt), (kept, tail, max_match, n, salt)
            found += bool(got[0])
    assert found > 50


@pytest.mark.parametrize("min_match", [POOL_KEY + 1, POOL_KEY + 2])
@pytest.mark.parametrize("seed", range(2))
def test_a_pool_copy_needs_min_match_tokens_as_a_request_s_own(min_match, seed):
    """A request whose own tokens repeat nothing copies from a pool text repeating exactly its last
    k tokens iff k >= min_match: min_match is the least, as for its own copies."""
    rng = random.Random(seed)
    prompt = rng.sample(range(1000), 8)  # distinct: its own tokens repeat nothing
    for k in (min_match - 1, min_match, min_match + 1):
        pool = LookupPool(capacity=64)
        pool.add([1000, *prompt[-k:], 1001, 1002])  # 1000 before: the run is exactly k
        lookup = PromptLookup(prompt, min_match=min_match, max_match=8)
        copied = lookup.next([], 2, pool)
        if k >= min_match:
            assert copied == [1001, 1002] and lookup.match == k and lookup.pooled, k
        else:
            assert copied == [] and lookup.match == 0 and not lookup.pooled, k


def test_the_pool_keeps_the_newest_texts_and_a_request_prefers_its_own():
    pool = LookupPool(capacity=12)
    pool.add([1, 2, 3, 4, 5])  # 6 tokens with its separator
    pool.add([7, 8, 9, 4])  # 5: both fit (11)
    assert pool.next(np.array([0, 1, 2, 3]), 8, 5) == ([4, 5], 3)  # the copy stops at its text's end
    pool.add([6, 6])  # 3 more: the oldest text goes
    assert pool.next(np.array([1, 2, 3]), 8, 5) == ([], 0) and len(pool) == 8
    pool.add(list(range(20, 40)))  # longer than the pool: its last 11 tokens, alone
    assert len(pool) == 12 and pool.tokens[:11].tolist() == list(range(29, 40))
    pool.clear()
    assert len(pool) == 0 and pool.next(np.array([29, 30, 31]), 8, 5) == ([], 0)
    pool.add([29, 30, 31, 32])  # after a clear, a copy stops at the end of the texts added since
    assert pool.next(np.array([29, 30, 31]), 8, 5) == ([32], 3)
    pool.clear()

    pool.add([5, 6, 7, 8, 1, 2, 3])
    own = PromptLookup([6, 7, 9, 0, 5, 6, 7], min_match=1, max_match=8)  # its own place: (6, 7) then 9
    assert own.next([], 3, pool) == [8, 1, 2] and own.match == 3 and own.pooled  # the pool's repeats more
    tie = PromptLookup([5, 6, 7, 4, 5, 6, 7], min_match=1, max_match=8)
    assert tie.next([], 3, pool) == [4, 5, 6] and tie.match == 3 and not tie.pooled  # a tie: its own
    short = PromptLookup([0, 1, 2], min_match=1, max_match=8)
    assert short.next([], 3, pool) == [] and short.match == 0  # (1, 2) is in the pool, (0, 1, 2) is not


@pytest.fixture(scope="module")
def pipeline():
    from trtspec.pipeline import load_pipeline

    return load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"))


PROMPTS = ["def parse(self, text):\n", "Q: 482 + 356\nA:", "import os\n", "class Server:\n    def",
           "def load(self, path):\n", "Q: 17 + 25\nA:", "import sys\n", "class Client:\n    def"]


@pytest.mark.parametrize("coupling", ["greedy", "gumbel"])
def test_answers_with_the_pool_are_the_target_alones(pipeline, coupling):
    """Eight requests through two slots, later ones starting after earlier ones finished: each text
    equals the target alone's, copies come from the pool and are accepted, the batch takes fewer
    target forwards than without the pool, and `reset` forgets it (a second run repeats the first)."""
    encode = pipeline.tokenizer.encode
    sampling = [SamplingParams() if coupling == "greedy" else
                SamplingParams(temperature=0.9, seed=40 + i, coupling="gumbel") for i in range(len(PROMPTS))]
    requests = [Request(encode(p, True), 96, s) for p, s in zip(PROMPTS, sampling, strict=True)]
    plain = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=2).generate_batch(requests)
    runs = {}
    for pool_tokens in (0, 4096):
        decoder = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=2,
                                     lookup=LookupConfig(pool_tokens=pool_tokens))
        runs[pool_tokens] = got = decoder.generate_batch(requests)
        assert [g.token_ids for g in got] == [p.token_ids for p in plain], pool_tokens
    pooled = runs[4096]
    assert sum(g.num_pool_accepted for g in pooled) > 0 and sum(g.num_pooled for g in runs[0]) == 0
    assert sum(g.num_pooled for g in pooled[:2]) == 0  # the first two found the pool empty
    for g in pooled:
        assert g.num_pool_accepted <= g.num_pooled <= g.num_looked_up
        assert g.num_pool_accepted <= g.num_lookup_accepted
    assert sum(g.num_target_calls for g in pooled) < sum(g.num_target_calls for g in runs[0])
    again = decoder.generate_batch(requests)
    assert [(g.num_pooled, g.num_target_calls) for g in again] == \
        [(g.num_pooled, g.num_target_calls) for g in pooled]


def test_rejection_sampled_answers_copying_other_requests_follow_the_target(pipeline):
    """1,000 seeded requests of one prompt, 8 at a time: each later one copies the earlier ones'
    sampled continuations from the pool (point masses, q(x) = 1), and the law of the first tokens
    is still the target's (these seeds: 2,030 copies, all from the pool, 1,924 accepted)."""
    prompt = list(b"x = compute(y) + 1\n")
    decoder = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=8,
                                 schedule=ScheduleConfig(mode="full"),
                                 lookup=LookupConfig(min_match=3, pool_tokens=8192))
    sampling = SamplingParams(temperature=1.0, top_k=3)
    assert_samples_follow_target(pipeline.target.model, decoder, prompt, sampling, steps=4, n=1000)


def test_bad_pool_fields_are_refused_by_name(tmp_path):
    text = (REPO / "build_configs" / "tiny-lookup.yaml").read_text().split("lookup:")[0]
    path = tmp_path / "pool.yaml"
    for fields, said in (("max_match: 2\n  pool_tokens: 1000", "lookup.pool_tokens: a pool place repeats at "
                                                                "least 3 tokens, above lookup.max_match 2"),
                         ("pool_tokens: -1", "lookup.pool_tokens")):
        path.write_text(text.replace("../", str(REPO) + "/") + f"lookup:\n  {fields}\n")
        with pytest.raises(ConfigError, match=said.replace(".", r"\.")):
            load_build_config(path)


@pytest.mark.parametrize("extra", [0, 1])
def test_a_pool_takes_a_vocabulary_whose_ids_fit_its_keys_and_refuses_one_more_by_name(extra):
    """A pool key packs each token id in KEY_BITS bits: a vocabulary of 2**KEY_BITS ids fits (its last
    id is 2**KEY_BITS − 1), one of 2**KEY_BITS + 1 is refused naming lookup.pool_tokens."""
    vocab = (1 << KEY_BITS) + extra
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, hidden_size=8, intermediate_size=8,
                                         num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                                         head_dim=8, tie_word_embeddings=True))
    build = partial(SpeculativeDecoder, TargetModel(model), None, [0], max_slots=1,
                    lookup=LookupConfig(pool_tokens=4096))
    if extra:
        said = f"lookup.pool_tokens: .* in {KEY_BITS} bits, .* has {vocab} ids; set it to 0"
        with pytest.raises(ValueError, match=said):
            build()
    else:
        assert build().pool is not None
