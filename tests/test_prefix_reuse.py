"""Prefix reuse in the serving loop: a request keeps the target's K/V (and the drafter's state) that
a finished request left in its slot for the prompt tokens they share, and decodes exactly as if it
had prefilled its whole prompt: same greedy text, same accepted drafts per step, same seeded samples."""

from __future__ import annotations

import pytest

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.spec.decoder import MIN_REUSE, Request, SpeculativeDecoder
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable

from .conftest import REPO

FULL = ScheduleConfig(mode="full")
SYSTEM = list(b"You are a careful assistant. Answer briefly, show your working, and never guess. " * 2)
USERS = [list(b" What is 12 times 7?"), list(b" And plus 5?"), list(b" Now write it in Python.")]


def _config(name: str):
    return load_build_config(REPO / "build_configs" / f"{name}.yaml")


@pytest.fixture(scope="module",
                params=["none", "tiny-dflash", "tiny-dspark", "tiny-eagle3", "tiny-draft-model"])
def pipeline(request):
    if request.param == "none":
        return load_pipeline(_config("tiny-dflash"), use_drafter=False)
    return load_pipeline(_config(request.param))


@pytest.fixture(scope="module")
def plain():
    return load_pipeline(_config("tiny-dflash"), use_drafter=False)


def _counting(decoder) -> list[int]:
    """Count the prompt tokens the decoder's target is fed (prefill chunks: those without a tree
    and longer than a verify row can be are not told apart, so count every chunk's tokens)."""
    fed = [0]
    forward = decoder.target.forward

    def counted(chunks, *args, **kwargs):
        fed[0] += sum(len(c.input_ids) for c in chunks)
        return forward(chunks, *args, **kwargs)

    decoder.target.forward = counted
    return fed


def _run(decoder, request: Request):
    rid = decoder.add(request)
    done = {}
    while decoder.lives:
        done.update(decoder.step())
    return done[rid]


def _chat(decoder, turns=USERS, max_tokens=20, sampling=None):
    """A multi-turn chat: each turn's prompt = the previous prompt + its answer + the new text."""
    prompt, results = list(SYSTEM), []
    for user in turns:
        prompt = prompt + user
        result = _run(decoder, Request(prompt, max_tokens, sampling or SamplingParams()))
        results.append(result)
        prompt = prompt + result.token_ids
    return results


def test_multi_turn_chat_decodes_as_without_reuse(pipeline):
    """Greedy texts AND accepted drafts per step equal with reuse on and off (a drafter state kept
    wrong changes what it drafts, not the greedy text), turns 2.. reuse, the target is fed less."""
    on, off = (pipeline.decoder_for(2, FULL, prefix_reuse=reuse) for reuse in (True, False))
    fed_on, fed_off = _counting(on), _counting(off)
    with_reuse, without = _chat(on), _chat(off)
    assert [r.token_ids for r in with_reuse] == [r.token_ids for r in without]
    assert [r.accept_counts for r in with_reuse] == [r.accept_counts for r in without]
    assert [r.cached_tokens for r in without] == [0, 0, 0]
    assert with_reuse[0].cached_tokens == 0
    for previous, now in zip(with_reuse, with_reuse[1:], strict=False):
        # all of the previous turn's prompt at least (its answer's last tokens may be left out;
        # EAGLE-3 needs the taps of its prompt's last 32 positions, CATCH_UP_WINDOW)
        eagle3 = pipeline.drafter.method == "eagle3"
        least = min(previous.prompt_len, now.prompt_len - 33 if eagle3 else now.prompt_len)
        assert now.cached_tokens >= least
    assert fed_on[0] == fed_off[0] - sum(r.cached_tokens for r in with_reuse)


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-draft-model"])
def test_a_plainly_decoded_answer_is_kept_too(name):
    """Adaptive speculation on a machine where drafting never pays decodes plainly (after its first
    probe): the drafter never absorbs the answer's taps (DFlash) or feeds its tokens (draft model),
    yet the next turn keeps the whole previous prompt + answer in the target (the last answer token
    is fed again: the target never held it)."""
    pipeline = load_pipeline(_config(name))
    slow = SPSTable(batch_tokens=[1, 64], steps_per_s=[100.0, 90.0], draft_batches=[1, 8], draft_lens=[1, 15],
                    draft_seconds=[[1.0, 1.0], [1.0, 1.0]])
    decoder = pipeline.decoder_for(1, ScheduleConfig(mode="adaptive"), cost_table=slow, prefix_reuse=True)
    first, second = _chat(decoder, USERS[:2])
    assert sum(first.drafted_counts) <= 16  # the probe at most
    assert second.cached_tokens == first.prompt_len + len(first.token_ids) - 1
    alone = pipeline.decoder_for(1, ScheduleConfig(mode="adaptive"), cost_table=slow, prefix_reuse=False)
    assert [r.token_ids for r in _chat(alone, USERS[:2])] == [first.token_ids, second.token_ids]


@pytest.mark.parametrize("coupling", ["rejection", "gumbel"])
def test_seeded_sampled_chat_samples_as_without_reuse(coupling):
    pipeline = load_pipeline(_config("tiny-dflash"))
    sampling = SamplingParams(temperature=0.9, top_k=20, seed=11, coupling=coupling)
    runs = [_chat(pipeline.decoder_for(2, FULL, prefix_reuse=reuse), sampling=sampling)
            for reuse in (True, False)]
    assert [r.token_ids for r in runs[0]] == [r.token_ids for r in runs[1]]
    assert [r.accept_counts for r in runs[0]] == [r.accept_counts for r in runs[1]]
    assert runs[0][-1].cached_tokens > 0


def _diverging(held: list[int], answer: list[int]) -> dict[str, tuple[list[int], int]]:
    """New prompts against a slot holding `held` + `answer`, and the positions each keeps."""
    other = list(b"\x07 Something else entirely.")  # a byte no answer here holds
    return {
        "inside the prompt": (held[:50] + other, 50),
        "inside the answer": (held + answer[:3] + other, len(held) + 3),
        "the whole prompt": (held + other, len(held)),
        "a strict prefix": (held[:60], 59),  # its last token is fed again for its logits
        "the same prompt": (held, len(held) - 1),
        "nothing shared": (other + held, 0),
    }


@pytest.mark.parametrize("case", ["inside the prompt", "inside the answer", "the whole prompt",
                                  "a strict prefix", "the same prompt", "nothing shared"])
def test_diverging_prompts_keep_what_they_share(plain, case):
    first = Request(SYSTEM + USERS[0], 12)
    decoder = plain.decoder_for(1, FULL, prefix_reuse=True)
    answer = _run(decoder, first).token_ids
    prompt, kept = _diverging(first.prompt, answer)[case]
    result = _run(decoder, Request(prompt, 12))
    assert result.cached_tokens == kept
    alone = plain.decoder_for(1, FULL, prefix_reuse=False)
    assert result.token_ids == _run(alone, Request(prompt, 12)).token_ids


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-eagle3", "tiny-draft-model"])
def test_diverging_prompts_with_a_drafter(name):
    """Each case at once per drafter: the drafter's kept state is cut where the prompts part."""
    pipeline = load_pipeline(_config(name))
    first = Request(SYSTEM + USERS[0], 8)
    on, off = (pipeline.decoder_for(1, FULL, prefix_reuse=reuse) for reuse in (True, False))
    for case, (prompt, kept) in _diverging(first.prompt, _run(off, first).token_ids).items():
        if case in ("the same prompt", "nothing shared"):  # the target-only test covers them
            continue
        _run(on, first)
        got, want = _run(on, Request(prompt, 8)), _run(off, Request(prompt, 8))
        assert (got.token_ids, got.accept_counts) == (want.token_ids, want.accept_counts), case
        assert got.cached_tokens <= kept, case
        if name == "tiny-eagle3":  # it needs its newest CATCH_UP_WINDOW (32) positions' taps
            assert got.cached_tokens == max(0, min(kept, len(prompt) - 33)), case
        elif case == "inside the answer":  # the answer's last positions may not be in its state yet
            assert got.cached_tokens >= len(first.prompt), case
        else:
            assert got.cached_tokens == kept, case


@pytest.mark.parametrize("name", ["none", "tiny-dflash"])
def test_concurrent_requests_recycle_slots_and_a_cancelled_slot(name):
    """Continuous batching, 2 slots for 2 chat turns of 3 conversations added as slots free up; one
    request cancelled while decoding and one while its prompt is prefilled in pieces: every other
    request decodes as without reuse, and the cancelled ones' slots are reused correctly (without a
    drafter the one cut off in its prefill is asked again into its slot, which keeps what it fed)."""
    config = _config("tiny-dflash")
    pipeline = load_pipeline(config, use_drafter=False) if name == "none" else load_pipeline(config)
    convs = [SYSTEM + list(f" Conversation {i}.".encode()) for i in range(3)]

    def serve(reuse: bool):
        decoder = pipeline.decoder_for(2, FULL, prefix_reuse=reuse)
        decoder.prefill_chunk = 64  # prompts fed over several steps
        prompts = {i: c + USERS[0] for i, c in enumerate(convs)}
        turn = dict.fromkeys(prompts, 0)
        waiting, results, rids, cancelled = list(prompts), {}, {}, set()
        while waiting or decoder.lives:
            while waiting and decoder.num_running < decoder.max_slots:
                i = waiting.pop(0)
                rids[decoder.add(Request(prompts[i], 8))] = i
            for rid, live in list(decoder.lives.items()):
                i = rids[rid]
                decoding = live.prefill is None and len(live.generated) >= 2
                prefilling = live.prefill is not None and live.prefill.fed > live.prefill.reused
                if i not in cancelled and (i, decoding, prefilling) in ((0, True, False), (1, False, True)):
                    decoder.cancel(rid)  # conversation 0 while decoding, 1 while its prompt goes in
                    cancelled.add(i)
                    waiting.append(i)  # asked again, whole
            for rid, result in decoder.step().items():
                i = rids[rid]
                got = (result.token_ids, result.accept_counts, result.cached_tokens)
                results.setdefault(i, []).append(got)
                turn[i] += 1
                if turn[i] < 2:  # two turns each: enough to recycle every slot
                    prompts[i] = prompts[i] + result.token_ids + USERS[turn[i]]
                    waiting.append(i)
        assert cancelled == {0, 1}
        return results

    on, off = serve(True), serve(False)
    def decoded(results):
        return {i: [r[:2] for r in rs] for i, rs in results.items()}

    assert decoded(on) == decoded(off)
    assert sum(r[2] for rs in on.values() for r in rs) > 0
    assert all(r[2] == 0 for rs in off.values() for r in rs)


def test_prompt_logprobs_reset_and_the_switch_keep_nothing(plain):
    decoder = plain.decoder_for(1, FULL, prefix_reuse=True)
    prompt = SYSTEM + USERS[0]
    _run(decoder, Request(prompt, 8))
    scored = _run(decoder, Request(prompt, 8, prompt_logprobs=0))
    assert scored.cached_tokens == 0 and len(scored.prompt_logprobs) == len(prompt) - 1
    assert _run(decoder, Request(prompt, 8)).cached_tokens == len(prompt) - 1
    decoder.reset()
    assert _run(decoder, Request(prompt, 8)).cached_tokens == 0
    off = plain.decoder_for(1, FULL, prefix_reuse=False)
    _run(off, Request(prompt, 8))
    assert _run(off, Request(prompt, 8)).cached_tokens == 0
    # a decoder built without the switch keeps nothing (`trtspec profile`'s and gpu_check's: they time
    # whole prefills)
    unswitched = SpeculativeDecoder(plain.target, None, plain.end_ids)
    _run(unswitched, Request(prompt, 8))
    assert _run(unswitched, Request(prompt, 8)).cached_tokens == 0
    # generate() starts from empty slots, as it always did
    assert decoder.generate(prompt, 8).cached_tokens == 0


def test_engine_flavour_keeps_nothing():
    """The engine target compacts freed positions away: no prefix held, the switch has no effect."""
    config = _config("tiny-dflash").model_copy(update={"flavour": "engine"})
    decoder = load_pipeline(config).decoder_for(1, FULL, prefix_reuse=True)
    prompt = SYSTEM + USERS[0]
    _run(decoder, Request(prompt, 6))
    assert _run(decoder, Request(prompt, 6)).cached_tokens == 0


def test_the_engine_flavour_refuses_a_config_that_asks_for_reuse():
    """`limits.prefix_reuse: true` written in an engine flavour's config asks for what it cannot do:
    refused, naming the field (it was taken silently, found fuzzing the engine flavour 2026-12-06),
    by `build --flavour engine` too; a config that does not ask builds as engine, and the served
    config it writes (which leaves the switch out) loads again, a deployment section beside it
    (whose enable_block_reuse the switch must otherwise agree with)."""
    from trtspec.config import BuildConfig, with_flavour
    from trtspec.errors import ConfigError
    from trtspec.triton.repo import served_build_config

    raw = _config("tiny-dflash").model_dump(exclude_unset=True)
    raw.setdefault("limits", {})["prefix_reuse"] = True
    with pytest.raises(ConfigError, match=r"limits.prefix_reuse true: flavour engine keeps no prefix"):
        with_flavour(BuildConfig.model_validate(raw), "engine")
    with pytest.raises(ValueError, match=r"limits.prefix_reuse true: flavour engine keeps no prefix"):
        BuildConfig.model_validate({**raw, "flavour": "engine"})
    del raw["limits"]["prefix_reuse"]
    engine = with_flavour(BuildConfig.model_validate(raw), "engine")
    raw["deployment"] = _config("qwen3-8b-dflash-h200").model_dump(exclude_unset=True)["deployment"]
    for config in (engine, BuildConfig.model_validate({**raw, "flavour": "engine"})):
        served = served_build_config(config)
        assert "prefix_reuse" not in served["limits"]
        assert BuildConfig.model_validate(served).flavour == "engine"


def test_the_served_config_keeps_the_reuse_switches_as_the_yaml_set_them():
    """One switch set, the other left at its default: the served config (written whole, it set both)
    loads again and says the same reuse (it was refused at load: "limits.prefix_reuse true
    contradicts deployment.enable_block_reuse false", found reviewing 2026-12-06)."""
    from trtspec.config import BuildConfig
    from trtspec.triton.repo import served_build_config

    raw = _config("tiny-dflash").model_dump(exclude_unset=True)
    deployment = _config("qwen3-8b-dflash-h200").model_dump(exclude_unset=True)["deployment"]
    deployment.pop("enable_block_reuse", None)
    for limits, block in (({"prefix_reuse": False}, {}), ({}, {"enable_block_reuse": False}),
                          ({"prefix_reuse": False}, {"enable_block_reuse": False})):
        config = BuildConfig.model_validate({**raw, "limits": {**raw.get("limits", {}), **limits},
                                             "deployment": {**deployment, **block}})
        served = BuildConfig.model_validate(served_build_config(config))
        assert (served.limits.prefix_reuse, served.deployment.enable_block_reuse) == \
            (config.limits.prefix_reuse, config.deployment.enable_block_reuse), (limits, block)


def test_the_switch_agrees_with_trtllm_block_reuse():
    raw = _config("qwen3-8b-eagle3").model_dump(exclude_unset=True)
    raw.setdefault("limits", {})["prefix_reuse"] = False
    raw["deployment"]["enable_block_reuse"] = True
    from trtspec.config import BuildConfig

    with pytest.raises(ValueError, match=r"prefix_reuse false contradicts deployment.enable_block_reuse"):
        BuildConfig.model_validate(raw)
    del raw["deployment"]["enable_block_reuse"]
    from trtspec.trtllm.args import llm_args

    args = llm_args(BuildConfig.model_validate(raw), for_triton=False)
    assert args["kv_cache_config"]["enable_block_reuse"] is False


def test_a_few_shared_tokens_do_not_take_a_slot_holding_a_conversation(plain):
    """A prompt that shares only a short opening (a role tag) with what a slot holds keeps nothing
    and takes an unused slot, so the conversation held there still serves its next turn; one that
    shares MIN_REUSE tokens keeps them."""
    decoder = plain.decoder_for(2, FULL, prefix_reuse=True)
    first = _run(decoder, Request(SYSTEM + USERS[0], 8))
    assert first.cached_tokens == 0
    tag, rest = SYSTEM[:MIN_REUSE - 1], list(b" Something else entirely, please.")
    other = _run(decoder, Request(tag + rest, 8))  # one token short of a reuse worth having
    assert other.cached_tokens == 0
    follow_up = SYSTEM + USERS[0] + first.token_ids + USERS[1]
    assert _run(decoder, Request(follow_up, 8)).cached_tokens == len(SYSTEM + USERS[0]) + 8 - 1
    exactly = plain.decoder_for(2, FULL, prefix_reuse=True)
    _run(exactly, Request(SYSTEM + USERS[0], 8))
    assert _run(exactly, Request(SYSTEM[:MIN_REUSE] + rest, 8)).cached_tokens == MIN_REUSE


@pytest.mark.parametrize("name", ["tiny-dflash", "tiny-dspark", "tiny-eagle3", "tiny-draft-model"])
def test_draft_trees_decode_as_without_reuse(name):
    """Tree drafting over a kept prefix: a tree writes its nodes after the committed tokens and keeps
    the accepted path, so what a slot holds afterwards must still be exactly the committed tokens'."""
    pipeline = load_pipeline(_config(name))
    tree = TreeConfig(nodes=8, topk=2)
    on, off = (pipeline.decoder_for(2, FULL, tree=tree, prefix_reuse=reuse) for reuse in (True, False))
    with_reuse, without = _chat(on), _chat(off)
    assert [r.token_ids for r in with_reuse] == [r.token_ids for r in without]
    assert [r.accept_counts for r in with_reuse] == [r.accept_counts for r in without]
    assert all(r.cached_tokens > len(SYSTEM) for r in with_reuse[1:])


def test_requests_finishing_together_are_absorbed_in_one_pass():
    """Two plainly decoded requests that end in the same step: DFlash projects both kept slots'
    pending taps in ONE context pass at release (it took one pass per request), and each next turn
    still keeps its whole previous prompt + answer and decodes as without reuse."""
    pipeline = load_pipeline(_config("tiny-dflash"))
    slow = SPSTable(batch_tokens=[1, 64], steps_per_s=[100.0, 90.0], draft_batches=[1, 8], draft_lens=[1, 15],
                    draft_seconds=[[1.0, 1.0], [1.0, 1.0]])
    decoder = pipeline.decoder_for(2, ScheduleConfig(mode="adaptive"), cost_table=slow, prefix_reuse=True)
    passes: list[list[int]] = []  # the slots of each context pass, in the current step
    absorb = decoder.drafter._absorb_pending

    def counted(slots: list[int]) -> None:
        passes.append(sorted(slots))
        absorb(slots)

    decoder.drafter._absorb_pending = counted
    prompts = [list(SYSTEM) + user for user in USERS[:2]]
    rids = [decoder.add(Request(p, 24)) for p in prompts]
    done: dict = {}
    while decoder.lives:
        passes.clear()
        finished = decoder.step()
        done.update(finished)
    assert len(finished) == 2  # both ended in the same step
    assert passes == [[0, 1]]
    answers = [done[r] for r in rids]
    # next turns, one at a time, each in the slot its prompt starts like
    follow = [p + a.token_ids + list(b" Why?") for p, a in zip(prompts, answers, strict=True)]
    again = [_run(decoder, Request(f, 16)) for f in follow]
    assert [r.cached_tokens for r in again] == [len(p) + len(a.token_ids) - 1
                                                for p, a in zip(prompts, answers, strict=True)]
    alone = pipeline.decoder_for(1, ScheduleConfig(mode="adaptive"), cost_table=slow, prefix_reuse=False)
    assert [r.token_ids for r in again] == [_run(alone, Request(f, 16)).token_ids for f in follow]
