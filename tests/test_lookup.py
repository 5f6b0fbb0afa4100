"""Prompt lookup (`trtspec.spec.lookup`): drafts copied from the request's own tokens.

Where it copies from is checked against a brute-force search on random sequences. In the decoder
the copies only propose: texts are the target alone's (greedy and Gumbel-coupled, alone and beside
a drafter, beside requests with predictions), in fewer target forwards; the law of rejection-sampled
answers is the target's, alone and beside a drafter; the cost model sends copies only where they pay;
a config builds it through the pipeline, bench names it, and a served deployment answers as the
target alone. TensorRT-LLM's NGram mapping is tests/test_trtllm.py's."""

from __future__ import annotations

import json as json_module
import random
import urllib.request

import pytest

from trtspec.config import LookupConfig, ScheduleConfig, load_build_config
from trtspec.errors import ConfigError
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.lookup import ANSWER_ROOM, WIDE, LookupPool, PromptLookup
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable

from .conftest import REPO, assert_samples_follow_target

PROMPTS = ["def parse(self, text):\n", "Q: 482 + 356\nA:", "import os\n", "class Server:\n    def"]


def _brute_force(tokens: list[int], min_match: int, max_match: int, n: int) -> list[int]:
    """The rule, spelt out: the longest run (min..max) of the last tokens found earlier; of those
    places, the one with the most tokens after it (at most n), then the newest; copy what follows."""
    length = len(tokens)
    for run in range(min(max_match, length - 1), min_match - 1, -1):
        ends = [s + run for s in range(length - run) if tokens[s : s + run] == tokens[length - run :]]
        if ends:
            end = max(ends, key=lambda e: (min(length - e, n), e))
            return tokens[end : end + n]
    return []


@pytest.mark.parametrize("seed", range(6))
def test_copies_from_the_longest_match_as_the_rule_says(seed):
    """Random prompts and answers over small vocabularies (many repeats), the answer fed a few
    tokens at a time as the decoder feeds it: every proposal is the brute-force search's."""
    rng = random.Random(seed)
    checked = 0
    for _ in range(300):
        vocab = rng.choice([2, 3, 5, 30])
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        answer = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        low, high, n = rng.randint(1, 3), rng.randint(3, 9), rng.randint(1, 12)
        lookup = PromptLookup(prompt, low, high)
        i = 0
        while i <= len(answer):
            got = lookup.next(answer[:i], n)
            assert got == _brute_force(prompt + answer[:i], low, high, n), (prompt, answer[:i], low, high, n)
            checked += bool(got)
            i += rng.randint(1, 4)
    assert checked > 500


def test_what_it_copies_on_small_cases():
    lookup = PromptLookup([1, 2, 3, 9, 1, 2], min_match=1, max_match=4)
    assert lookup.next([], 3) == [3, 9, 1] and lookup.match == 2  # (1, 2) ends at 2: copy 3, 9, 1
    assert lookup.next([7], 3) == []  # 7 never came before
    assert lookup.match == 0
    loop = PromptLookup([5, 6, 7, 5, 6, 7], min_match=1, max_match=8)
    assert loop.next([], 8) == [5, 6, 7]  # a whole period, not the one token after the newest match
    strict = PromptLookup([1, 2, 3, 9, 1, 2], min_match=3, max_match=4)
    assert strict.next([], 3) == []  # only 2 tokens match
    assert strict.next([3], 3) == [9, 1, 2]  # now (1, 2, 3) does
    rng = random.Random(5)  # over WIDE places: narrowed one position at a time first
    wide = [rng.randrange(2) for _ in range(3 * WIDE)]
    for low, high, n in ((1, 8, 6), (1, 24, 4), (5, 9, 16)):
        assert PromptLookup(wide, low, high).next([], n) == _brute_force(wide, low, high, n)
    grows = PromptLookup([4, 4], min_match=1, max_match=2)
    answer = [4] * (ANSWER_ROOM + 5)  # past the room it made for an answer
    assert grows.next(answer, 2) == [4, 4] and grows.length == ANSWER_ROOM + 7


@pytest.mark.parametrize("seed", range(3))
def test_asked_for_no_tokens_it_copies_nothing_yet_keeps_the_answer(seed):
    """n = 0 (no room left to draft): no copy and no match reported (`match` prices the copy), the
    pool's place forgotten too; the answer fed meanwhile is kept, so the next ask is the rule's. A
    lookup that has not been asked yet has matched nothing either."""
    rng = random.Random(seed)
    prompt = [rng.randrange(3) for _ in range(30)]
    answer = [rng.randrange(3) for _ in range(12)]
    pool = LookupPool(capacity=64)
    pool.add(prompt[-6:] + [7, 8])  # the prompt's last 6 tokens, then what the pool's copy drafts
    lookup = PromptLookup(prompt, min_match=1, max_match=8)
    assert lookup.match == 0 and not lookup.pooled  # nothing asked yet
    assert lookup.next([], 2, pool) == [7, 8] and lookup.match == 6 and lookup.pooled
    assert lookup.next(answer[:5], 0, pool) == [] and lookup.match == 0 and not lookup.pooled
    assert lookup.next(answer, 4) == _brute_force(prompt + answer, 1, 8, 4)


def test_over_wide_places_each_narrowing_step_keeps_to_the_rule():
    """Over WIDE places of the last token, places are narrowed one position at a time: a run may
    reach back to the prompt's first token, the token compared is the one before the run matched
    so far, and the run stops at max_match however many places are left."""
    ones = [1] * (WIDE + 5)
    for prompt, match in (([0, *ones, 0, 1], 2),  # only the place at the start repeats (0, 1)
                          ([3, 0, *ones, 0, 1], 2),  # (3, 0, 1) is nowhere: the run is (0, 1)
                          ([4] * (3 * WIDE), 8)):  # every place repeats max_match tokens and more
        lookup = PromptLookup(prompt, min_match=2, max_match=8)
        assert lookup.next([], 3) == _brute_force(prompt, 2, 8, 3) and lookup.match == match, prompt[:3]


@pytest.fixture(scope="module", params=["tiny-dflash", "tiny-draft-model"])
def pipeline(request):
    from trtspec.pipeline import load_pipeline

    return load_pipeline(load_build_config(REPO / "build_configs" / f"{request.param}.yaml"))


def _decoder(pipeline, slots: int, drafter: bool, table: SPSTable | None = None,
             lookup: LookupConfig | None = None) -> SpeculativeDecoder:
    schedule = ScheduleConfig(mode="full" if table is None else "adaptive")  # adaptive: copies priced
    return SpeculativeDecoder(pipeline.target, pipeline.drafter if drafter else None, pipeline.end_ids,
                              schedule=schedule, cost_table=table, max_slots=slots,
                              lookup=lookup or LookupConfig())


@pytest.mark.parametrize("coupling", ["greedy", "gumbel"])
@pytest.mark.parametrize("drafter", [False, True], ids=["alone", "beside-drafter"])
def test_an_answer_is_the_target_alones(pipeline, coupling, drafter):
    """Four requests together, one with a prediction: each text equals the target alone's, and the
    copies are accepted often enough to save target forwards over the batch."""
    encode = pipeline.tokenizer.encode
    sampling = [SamplingParams() if coupling == "greedy" else
                SamplingParams(temperature=0.9, seed=21 + i, coupling="gumbel") for i in range(4)]
    requests = [Request(encode(p, True), 128, s) for p, s in zip(PROMPTS, sampling, strict=True)]
    plain = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=4).generate_batch(requests)
    requests[0].prediction = tuple(plain[0].token_ids[:40])
    lookup = LookupConfig(min_match=4 if drafter else 1)
    got = _decoder(pipeline, 4, drafter, lookup=lookup).generate_batch(requests)
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    assert sum(g.num_lookup_accepted for g in got) > 0
    assert sum(g.num_target_calls for g in got) < sum(p.num_target_calls for p in plain)
    for g in got:
        assert g.num_lookup_accepted <= g.num_looked_up <= g.num_drafted
        assert g.num_lookup_accepted <= g.num_accepted
        if not drafter:  # every draft of a deployment without a drafter is a copy (or predicted)
            assert g.num_drafted == g.num_looked_up
    assert got[0].num_prediction_accepted > 0  # its prediction goes first while the answer follows it


@pytest.mark.parametrize("drafter", [False, True], ids=["alone", "beside-drafter"])
def test_rejection_sampled_answers_with_lookup_follow_the_target(pipeline, drafter):
    """Each copied draft a point mass (q(x) = 1), beside the drafter's rows with their own q: the law
    of a sampled request's first tokens is the target's. The prompt repeats itself, so copies are
    offered from the first step; beside the drafter, rows whose last token is new to them draft
    from it (DFlash, these 1,000 seeds: 711 copies, 198 accepted, and 1,835 drafts, 595 accepted)."""
    prompt = list(b"self.x = self.x + self.")
    decoder = _decoder(pipeline, 8, drafter)
    sampling = SamplingParams(temperature=1.0, top_k=3)
    assert_samples_follow_target(pipeline.target.model, decoder, prompt, sampling, steps=4, n=1000)


FREE_VERIFY = SPSTable(batch_tokens=[1, 512], steps_per_s=[100.0, 100.0], machine="given here")
# a forward of 1 token takes 10 ms, one of 2 or more 1,000 s a token: no draft can pay for itself
DEAR_VERIFY = SPSTable(batch_tokens=[1, 2], steps_per_s=[100.0, 0.001], machine="given here")


def test_the_cost_model_sends_copies_only_where_they_pay(pipeline):
    """Copies go through the drafter's cost model (`spec.cost.admit_rows`: the rows and common length
    that maximise expected tokens per second): where a fed token costs nothing they go whole, where
    any costs seconds none goes. The texts stay the target's either way. A copy costs no drafter
    time: free verification beside a drafter measured at a second a pass still sends them whole."""
    encode = pipeline.tokenizer.encode
    requests = [Request(encode(p, True), 96) for p in PROMPTS]
    plain = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=4).generate_batch(requests)
    lengths = {}
    slow_drafter = FREE_VERIFY.model_copy(update={"draft_batches": [1, 8], "draft_lens": [1, 16],
                                                   "draft_seconds": [[1.0, 1.0], [1.0, 1.0]]})
    for name, table in (("free", FREE_VERIFY), ("dear", DEAR_VERIFY), ("slow drafter", slow_drafter)):
        got = _decoder(pipeline, 4, False, table).generate_batch(requests)
        assert [g.token_ids for g in got] == [p.token_ids for p in plain], name
        lengths[name] = {d for g in got for d in g.drafted_counts}
    assert max(lengths["free"]) == max(lengths["slow drafter"]) == LookupConfig().num_draft_tokens
    assert lengths["dear"] == {0}


def test_a_config_builds_it_and_the_target_alone_leaves_it_out(tmp_path):
    """`lookup:` in a build config without a drafter: the pipeline's decoder copies, adaptive (priced
    by a cost table measured for the target alone, its grid as long as the copies), and
    `use_drafter=False` (bench's baseline) does not."""
    from trtspec.pipeline import load_pipeline

    text = (REPO / "build_configs" / "tiny-dflash.yaml").read_text()
    config_path = tmp_path / "ngram.yaml"
    config_path.write_text(text.split("drafter:")[0].replace("../", str(REPO) + "/")
                           + "lookup:\n  num_draft_tokens: 6\n  min_match: 2\n")
    config = load_build_config(config_path)
    assert config.drafter is None and config.lookup.min_match == 2
    decoder = load_pipeline(config).decoder_for(2)
    assert decoder.lookup == config.lookup and decoder.schedule.mode == "adaptive"
    assert decoder.cost_table.verify_tokens_per_row[-1] == 7  # its R x t grid reaches 6 copies + 1
    result = decoder.generate_batch([Request(list(b"a = b; a = b; a = b; a"), 32)])[0]
    assert result.num_looked_up > 0 and result.num_draft_tokens == 6
    assert load_pipeline(config, use_drafter=False).decoder_for(1).lookup is None


def test_bad_lookup_fields_are_refused_by_name(tmp_path):
    text = (REPO / "build_configs" / "tiny-dflash.yaml").read_text().replace("../", str(REPO) + "/")
    bad = {"lookup:\n  min_match: 9\n  max_match: 4\n": "lookup.min_match 9 exceeds lookup.max_match 4",
           "lookup:\n  num_draft_tokens: 0\n": "lookup.num_draft_tokens",
           "lookup:\n  match: 3\n": "lookup.match"}
    for extra, said in bad.items():
        path = tmp_path / "bad.yaml"
        path.write_text(text + extra)
        with pytest.raises(ConfigError, match=said.replace(".", r"\.")):
            load_build_config(path)
    path.write_text(text.replace("drafter:\n", "drafter:\n  tree:\n    nodes: 8\n") + "lookup: {}\n")
    with pytest.raises(ConfigError, match="lookup drafts chains"):
        load_build_config(path)


def test_a_served_lookup_deployment_answers_as_the_target_alone(tmp_path):
    """tiny-lookup-pool.yaml behind a real tritonserver: streamed gRPC answers are the target alone's
    token for token, with copies drafted and accepted (the serving loop's adaptive schedule prices
    them), later requests copying from earlier ones too (the pool), and Prometheus counts them by
    source."""
    from trtspec.pipeline import load_pipeline
    from trtspec.triton.client import GenerateParams, generate

    from .conftest import triton_serving

    config = load_build_config(REPO / "build_configs" / "tiny-lookup-pool.yaml")
    expected = {}

    def decode_alone() -> None:  # the reference, while the server's stub loads
        alone = load_pipeline(config, use_drafter=False)
        encode = alone.tokenizer.encode
        expected.update({p: alone.decoder.generate(encode(p), 64).token_ids for p in PROMPTS[:3]})

    with triton_serving(config, tmp_path, decode_alone) as server:
        drafted = accepted = 0
        for prompt, ids in expected.items():
            params = GenerateParams(max_tokens=64, stream=True)
            got = generate(server.grpc_url, config.name, prompt, params)
            assert got.token_ids == ids, prompt
            drafted, accepted = drafted + got.draft_tokens, accepted + got.accepted_tokens
        assert 0 < accepted <= drafted
        metrics = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    names = ("trtspec_copied_draft_tokens_total", "trtspec_copied_accepted_tokens_total")
    copied = {source: [sum(float(line.split()[-1]) for line in metrics.splitlines()
                           if line.startswith(name + "{") and f'source="{source}"' in line)
                       for name in names] for source in ("lookup", "pool")}
    # every draft of this deployment is a copy, from the request's own tokens or the pool's
    both = [own + pooled for own, pooled in zip(copied["lookup"], copied["pool"], strict=True)]
    assert both == [drafted, accepted]
    assert copied["pool"][1] > 0, copied


def test_bench_names_each_way_of_drafting():
    from trtspec.config import method_name

    names = {p: method_name(load_build_config(REPO / "build_configs" / p)) for p in
             ("tiny-dflash.yaml", "tiny-lookup.yaml", "tiny-dflash-lookup.yaml", "tiny-lookup-pool.yaml",
              "tiny-dflash-lookup-pool.yaml")}
    assert names == {"tiny-dflash.yaml": "dflash", "tiny-lookup.yaml": "lookup",
                     "tiny-dflash-lookup.yaml": "dflash-lookup", "tiny-lookup-pool.yaml": "lookup-pool",
                     "tiny-dflash-lookup-pool.yaml": "dflash-lookup-pool"}
    alone = load_build_config(REPO / "build_configs" / "tiny-lookup.yaml").model_copy(update={"lookup": None})
    assert method_name(alone) == "none"


def test_generate_reports_what_lookup_copied():
    """`trtspec generate --json` with a lookup config says it is on and what it copied; `--drafter
    none` (the target alone) copies nothing."""
    import json

    from click.testing import CliRunner

    from trtspec.cli import main

    config = str(REPO / "build_configs" / "tiny-lookup.yaml")
    args = ["generate", "--config", config, "--prompt", "x = x + 1\nx = x + 1\n", "--max-tokens", "40",
            "--json"]
    out = json.loads(CliRunner().invoke(main, args).output)
    assert out["lookup"] == LookupConfig().model_dump()
    assert 0 < out["num_lookup_accepted"] <= out["num_looked_up"] == out["num_drafted"]
    alone = json.loads(CliRunner().invoke(main, [*args, "--drafter", "none"]).output)
    assert "lookup" not in alone and "num_looked_up" not in alone and alone["num_drafted"] == 0
    assert alone["token_ids"] == out["token_ids"]


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "unit": {"enum": ["cm", "kg"]}},
          "required": ["answer", "unit"]}
JSON_PROMPT = '{"answer": 3, "unit": "kg"}\n{"answer": 41, "unit": "cm"}\n'


@pytest.mark.parametrize("coupling", ["greedy", "gumbel"])
def test_guided_copies_keep_to_the_guide_and_the_text_is_the_guided_targets(pipeline, coupling, monkeypatch):
    """A guided request copies too, each copy chain cut where its guide would refuse a draft: every
    chain the verifier's mask walks is one the guide allows, the texts are the guided target
    alone's, and a JSON answer copies the keys its prompt shows."""
    from trtspec.spec.grammar import Guide

    sampling = SamplingParams() if coupling == "greedy" else SamplingParams(temperature=0.9, seed=5,
                                                                            coupling="gumbel")
    guides = [pipeline.guides.compile(Guide("json_schema", json_module.dumps(SCHEMA))),
              pipeline.guides.compile(Guide("regex", r"( [0-9]+[-*/])+ ?[0-9]+;"))]
    requests = [Request(list(JSON_PROMPT.encode()), 80, sampling, guide=guides[0]),
                Request(list(b"Q: 12 * 3 - 4; 7 * 3 - 4;\nA:"), 80, sampling, guide=guides[1]),
                Request(list(JSON_PROMPT.encode()), 80, sampling)]
    plain = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=3).generate_batch(requests)
    refused, walked = [], 0
    copied = SpeculativeDecoder._copied

    def walked_copies(self, running, context, prompt):  # each guided row's copies, walked on its matcher
        nonlocal walked
        out, looked_up = copied(self, running, context, prompt)
        for i in looked_up:
            matcher, taken = running[i].grammar and running[i].grammar.matcher, 0
            for token in out[i] if matcher else ():
                if matcher.is_terminated() or not matcher.accept_token(token):
                    refused.append(token)
                    break
                taken += 1
            if matcher:
                matcher.rollback(taken)
                walked += taken
        return out, looked_up

    monkeypatch.setattr(SpeculativeDecoder, "_copied", walked_copies)
    got = _decoder(pipeline, 3, drafter=False).generate_batch(requests)
    assert [g.token_ids for g in got] == [p.token_ids for p in plain]
    assert refused == [] and walked > 0 and got[0].num_lookup_accepted > 0


def test_rejection_sampled_guided_answers_with_lookup_follow_the_guided_target(pipeline):
    """Under a regex guide, copies of the prompt's worked answer cut to what the guide allows (the
    first accepted, the next most often not): each of the first 4 positions' law is the guided
    target's exact one."""
    from trtspec.spec.grammar import Guide
    from trtspec.triton.verify import allowed_after

    guide = pipeline.guides.compile(Guide("regex", r" [0-9]+[-*][0-9]+=[0-9]+;"))
    allowed = allowed_after(guide, pipeline.end_ids, pipeline.target.vocab_size)
    assert_samples_follow_target(pipeline.target.model, _decoder(pipeline, 16, drafter=False),
                                 list(b"Q: 2*3=6;\nA: 2*3=6;\nQ: 2*3=6;\nA:"),
                                 SamplingParams(temperature=1.0, top_k=3), steps=4,
                                 guide=guide, allowed=allowed)
