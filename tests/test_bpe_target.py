"""A target with a Hugging Face tokenizer, laid out as Llama-3.1-8B-Instruct is
(`tests/bpe_checkpoint.py`): a BOS the tokenizer adds to every text, a chat template that writes
it itself, and three end ids in generation_config.json. What trtspec decodes, in process and
served over the OpenAI API, must be what transformers' `generate` gives for the same prompt ids,
ending where `generate` ends.
"""

from __future__ import annotations

import functools
import json
import random
import re
import shutil
import urllib.request

import pytest
import torch
import yaml
from click.testing import CliRunner
from transformers import AutoTokenizer

from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.spec.decoder import SpeculativeDecoder
from trtspec.spec.grammar import Guide
from trtspec.tokenizer import ByteTokenizer
from trtspec.triton.request import TextStream

from .bpe_checkpoint import (
    BOS,
    END_OF_TEXT,
    EOM,
    EOT,
    MASK_ID,
    SAMPLING,
    VOCAB,
    metaspace_tokenizer,
    write_bpe_target,
)
from .conftest import serve_cli
from .test_cli_errors import assert_run_error

PROMPTS = load_prompts("code")[:4] + load_prompts("math")[:4] + load_prompts("chat")[:4]
MAX_TOKENS = 48


def _write_config(root, target_dir, draft_dir) -> str:
    config = {"name": "bpe", "flavour": "torch", "target": {"path": str(target_dir)},
              "drafter": {"method": "draft_model", "path": str(draft_dir), "num_draft_tokens": 4,
                          "schedule": {"mode": "full"}},
              "limits": {"max_tokens": 256}}
    path = root / "bpe.yaml"
    path.write_text(yaml.safe_dump(config))
    return str(path)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpe")
    ids = write_bpe_target(root / "target", root / "draft")
    return root, ids, _write_config(root, root / "target", root / "draft")


@pytest.fixture(scope="module")
def pipeline(checkpoint):
    return load_pipeline(load_build_config(checkpoint[2]))


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    return AutoTokenizer.from_pretrained(checkpoint[0] / "target", local_files_only=True)


@pytest.fixture(scope="module")
def served(checkpoint, tmp_path_factory):
    """`trtspec serve` of the checkpoint, with an OpenAI frontend."""
    out = tmp_path_factory.mktemp("bpe-build")
    assert CliRunner().invoke(main, ["build", checkpoint[2], "--out", str(out)]).exit_code == 0
    with serve_cli(out) as served:
        yield served


def _generate(pipeline, ids: list[int], max_tokens: int = MAX_TOKENS, **options) -> list[int]:
    """transformers' greedy `generate` with the checkpoint's own generation config (its end ids),
    and `options` over it."""
    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = pipeline.target.model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                                             max_new_tokens=max_tokens, **options)
    return out[0, len(ids):].tolist()


def test_the_tokenizer_adds_its_bos_and_every_end_of_generation_config_ends(checkpoint, pipeline, tokenizer):
    ids = checkpoint[1]
    assert pipeline.end_ids == (ids[EOT], ids[END_OF_TEXT], ids[EOM])  # the tokenizer's first
    assert pipeline.tokenizer.encode("Hello") == tokenizer("Hello").input_ids
    assert pipeline.tokenizer.encode("Hello")[0] == ids[BOS]
    assert pipeline.tokenizer.encode("Hello", add_special_tokens=False)[0] != ids[BOS]


def test_speculative_decoding_ends_where_generate_ends(checkpoint, pipeline, tokenizer):
    ends = set(pipeline.end_ids)
    endings = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        got = pipeline.decoder.generate(ids, MAX_TOKENS).token_ids
        assert got == _generate(pipeline, ids), prompt
        endings.append(got[-1] if got[-1] in ends else None)
    # the prompts end on generation_config's other ends too, not only on the tokenizer's
    assert {checkpoint[1][END_OF_TEXT], checkpoint[1][EOM]} & set(endings), endings


def test_a_guide_holds_the_text_over_a_hugging_face_tokenizer(pipeline, tokenizer):
    """Guided decoding with XGrammar's tokenizer info read from a byte-level BPE `tokenizer.json`
    (multi-byte pieces, specials, a model vocabulary padded past the tokenizer's): the text keeps
    to the guide, and the draft model's speculation gives the guided target alone's text."""
    regex = r"[a-z ]{1,12}[.]"  # at most 13 characters: every text ends within MAX_TOKENS
    compiled = pipeline.guides.compile(Guide("regex", regex))
    alone = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids)
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        want = alone.generate(ids, MAX_TOKENS, guide=compiled).token_ids
        assert pipeline.decoder.generate(ids, MAX_TOKENS, guide=compiled).token_ids == want, prompt
        assert want[-1] in pipeline.end_ids and re.fullmatch(regex, tokenizer.decode(want[:-1])), want
        assert any(len(tokenizer.decode([t])) > 1 for t in want)  # multi-character pieces, not bytes


def test_chat_in_process_is_generate_on_the_templates_ids(pipeline, tokenizer):
    for prompt in PROMPTS[:4]:
        messages = [{"role": "user", "content": prompt}]
        for variables in ({}, {"enable_thinking": False}):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                **variables)["input_ids"]
            text, result = pipeline.chat(messages, MAX_TOKENS, **variables)
            want = _generate(pipeline, ids)
            assert (text, result.token_ids) == (tokenizer.decode(want, skip_special_tokens=True), want)


def test_a_checkpoint_without_its_tokenizer_or_with_bad_end_ids_is_one_line(checkpoint, tmp_path):
    root, _, _ = checkpoint
    bare = tmp_path / "target"
    shutil.copytree(root / "target", bare)
    config = _write_config(tmp_path, bare, root / "draft")
    args = ["generate", "--config", config, "--prompt", "Hello", "--max-tokens", "4"]

    (bare / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 4000]}))
    assert_run_error(CliRunner().invoke(main, args), "generation_config.json", "eos_token_id", "4000")
    (bare / "generation_config.json").write_text("{not json")
    assert_run_error(CliRunner().invoke(main, args), "generation_config.json", "not a JSON object")
    (bare / "generation_config.json").write_text(json.dumps({"temperature": -1}))
    build = ["build", config, "--out", str(tmp_path / "out")]
    assert_run_error(CliRunner().invoke(main, build), "generation_config.json", "temperature must be", "-1")
    assert not (tmp_path / "out").exists()
    (bare / "generation_config.json").unlink()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (bare / name).unlink()
    # transformers alone would build an empty tokenizer here, and every prompt would encode to []
    assert_run_error(CliRunner().invoke(main, args), str(bare), "has no tokenizer")


@pytest.mark.parametrize("template", [True, 5])
def test_a_chat_template_that_is_no_text_is_named(checkpoint, tmp_path, template):
    """tokenizer_config.json's chat_template true or 5: a TypeError traceback ("Can't compile non
    template nodes") as the first chat prompt was rendered."""
    target = tmp_path / "t"
    shutil.copytree(checkpoint[0] / "target", target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config_file = target / "tokenizer_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "chat_template": template}))
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"name": "t", "flavour": "torch", "target": {"path": str(target)}}))
    args = ["generate", "--config", str(config), "--chat", "--max-tokens", "2", "--prompt", "hi"]
    assert_run_error(CliRunner().invoke(main, args),
                     f"{config_file}: chat_template must be a Jinja template text, got {template!r}")


def _ask(client, route: str, body: dict, stream: bool) -> tuple[str, str, object]:
    """(text, finish_reason, usage) of one OpenAI request, whole or streamed."""
    api = client.chat.completions if route == "chat" else client.completions
    if not stream:
        reply = api.create(model="bpe", max_tokens=MAX_TOKENS, temperature=0, **body)
        choice = reply.choices[0]
        return choice.message.content if route == "chat" else choice.text, choice.finish_reason, reply.usage
    chunks = [c.choices[0] for c in api.create(model="bpe", max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                               **body) if c.choices]
    text = "".join((c.delta.content or "") if route == "chat" else c.text for c in chunks)
    return text, chunks[-1].finish_reason, None


def test_served_chat_and_completions_equal_generate(served, pipeline, tokenizer):
    """Chat: the template's own BOS, not a second one; completions: the tokenizer's BOS, or none
    with vLLM's `add_special_tokens: false`; all end where `generate` ends, streaming or not, with
    OpenAI's finish_reason and token counts."""
    ends = set(pipeline.end_ids)
    client = served.client()
    # code prompts 1-3 and math prompt 0: on each of the four routes one ends at the length and one at
    # an end id, and all three end ids (the tokenizer's and generation_config's two others) end some;
    # code 0 and math 1 added only endings these have
    for prompt in PROMPTS[1:5]:
        messages = [{"role": "user", "content": prompt}]
        chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        quick = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              enable_thinking=False)
        no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}  # vLLM's extension
        cases = [
            ("chat", chat_ids["input_ids"], dict(messages=messages)),
            ("chat", quick["input_ids"], dict(messages=messages, extra_body=no_thinking)),
            ("completions", tokenizer(prompt).input_ids, dict(prompt=prompt)),
            ("completions", tokenizer(prompt, add_special_tokens=False).input_ids,
             dict(prompt=prompt, extra_body={"add_special_tokens": False})),
        ]
        for route, ids, body in cases:
            want = _generate(pipeline, ids)
            text = tokenizer.decode(want, skip_special_tokens=True)
            finish = "stop" if want[-1] in ends else "length"
            got, got_finish, usage = _ask(client, route, body, stream=False)
            assert (got, got_finish) == (text, finish), (route, body, prompt)
            assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), len(want))
            assert _ask(client, route, body, stream=True)[:2] == (text, finish)

    # vLLM's stop_token_ids end a request too, and min_tokens holds them back like the end ids
    for prompt in PROMPTS:
        ids = tokenizer(prompt).input_ids
        free = _generate(pipeline, ids)
        stops = [t for i, t in enumerate(free) if i >= 3 and t not in free[:i] and t not in ends]
        if stops:
            break
    stop = stops[0]
    for at_least in (0, free.index(stop) + 3):
        want = _generate(pipeline, ids, min_new_tokens=at_least, eos_token_id=[*pipeline.end_ids, stop])
        extra = {"stop_token_ids": [stop], "min_tokens": at_least}
        reply = client.completions.create(model="bpe", prompt=prompt, max_tokens=MAX_TOKENS,
                                          temperature=0, extra_body=extra)
        said = want[:-1] if want[-1] == stop else want  # the stop id's own text is left out, as vLLM does
        assert reply.choices[0].text == tokenizer.decode(said, skip_special_tokens=True), at_least
        assert reply.usage.completion_tokens == len(want)
        assert at_least or (want[-1] == stop and reply.choices[0].finish_reason == "stop")

    # logprobs: each token named as it decodes alone, special tokens shown (the end id too)
    ended = [(p, tokenizer(p).input_ids) for p in PROMPTS]
    prompt, ids, want = next((p, i, w) for p, i in ended if (w := _generate(pipeline, i))[-1] in ends)
    got = client.completions.create(model="bpe", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                    logprobs=2).choices[0].logprobs
    assert got.tokens == [tokenizer.decode([i], skip_special_tokens=False) for i in want]
    with torch.no_grad():
        logits = pipeline.target.model(torch.tensor([ids + want])).logits[0, len(ids) - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1)[torch.arange(len(want)), want]
    assert torch.allclose(torch.tensor(got.token_logprobs), logp, atol=1e-4)
    # echo: the prompt's tokens first, the tokenizer's BOS among them, its first scored by nothing
    status, body = served.post("/v1/completions", {"model": "bpe", "prompt": prompt, "max_tokens": 2,
                                                   "temperature": 0, "echo": True, "logprobs": 0})
    assert status == 200 and body["choices"][0]["text"].startswith(prompt)
    echoed = body["choices"][0]["logprobs"]
    assert echoed["tokens"][: len(ids)] == [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    assert echoed["tokens"][0] == tokenizer.bos_token and echoed["token_logprobs"][0] is None
    with torch.no_grad():
        logits = pipeline.target.model(torch.tensor([ids])).logits[0, :-1]
    want = torch.log_softmax(logits.float(), -1)[torch.arange(len(ids) - 1), ids[1:]]
    assert torch.allclose(torch.tensor(echoed["token_logprobs"][1 : len(ids)]), want, atol=1e-4)

    # vLLM's tokenizer routes, on a Hugging Face tokenizer
    assert served.post("/tokenize", {"prompt": prompt})[1]["tokens"] == tokenizer(prompt).input_ids
    assert served.post("/tokenize", {"prompt": prompt, "add_special_tokens": False})[1]["tokens"] == \
        tokenizer(prompt, add_special_tokens=False).input_ids
    messages = [{"role": "user", "content": prompt}]
    assert served.post("/tokenize", {"messages": messages})[1]["tokens"] == \
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert served.post("/detokenize", {"tokens": ids})[1]["prompt"] == tokenizer.decode(ids,
                                                                                        skip_special_tokens=True)
    with urllib.request.urlopen(f"{served.base}/tokenizer_info", timeout=10) as resp:
        info = json.loads(resp.read())
    assert (info["eos_token"], info["bos_token"]) == (tokenizer.eos_token, tokenizer.bos_token)
    assert info["chat_template"] == tokenizer.chat_template and info["tokenizer_class"]

    # a request that leaves the sampling parameters out gets generation_config.json's, as vLLM's do
    def sampled(**params) -> str:
        return client.completions.create(model="bpe", prompt=PROMPTS[0], max_tokens=MAX_TOKENS, seed=7,
                                         **params).choices[0].text

    assert sampled() == sampled(**SAMPLING) != sampled(temperature=1.0, top_p=1.0)


def test_verify_over_openai_tests_the_sampled_law_of_texts(served, checkpoint):
    """Over openai:// a BPE text need not tokenize into the split the target sampled: re-tokenized,
    200 sampled texts of this correct server gave 200 first tokens the target never samples (the
    BOS the tokenizer adds), 62 second and 148 third ones, and it failed. `verify` tests the law of
    the whole texts of 3-token requests against their exact law instead: the server passes."""
    result = CliRunner().invoke(main, ["verify", "--url", served.url, "--config", checkpoint[2],
                                       "--max-tokens", "8", "--samples", "100"])
    assert result.exit_code == 0, result.output
    assert "law of the text of 3-token requests" in result.output and "PASS: lossless" in result.output
    assert result.output.count("sample  text:") == 4 and "guided by regex '[^" in result.output
    assert "logit_bias {" in result.output  # plain, guided, under every other processor, and a bad word
    assert ", bad word " in result.output
    assert "never samples" not in result.output and "tokenized again" not in result.output
    assert "the server drafted 100 tokens" in result.output  # each request's token 2 was a draft


def test_a_drafter_trains_on_the_targets_tokens_and_chat(checkpoint, pipeline, tokenizer, tmp_path):
    """`trtspec train dflash` regenerates from the prompts as the target's tokenizer encodes them
    (text with its BOS, conversations through its chat template) and stops each continuation at
    the target's end ids, as `generate` does; the drafter it writes serves losslessly."""
    root = checkpoint[0]
    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[8]}]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(row) for row in [
        {"prompt": PROMPTS[0]}, {"messages": conversation}, {"prompt": PROMPTS[4]}]) + "\n")
    out = tmp_path / "dflash"
    result = CliRunner().invoke(main, ["train", "dflash", "--target", str(root / "target"), "--prompts",
                                       str(prompts), "--out", str(out), "--block-size", "4", "--layers", "1",
                                       "--target-layer-ids", "1", "--response-tokens", "24", "--max-steps",
                                       "2", "--mask-token-id", str(MASK_ID)])
    assert result.exit_code == 0, result.output
    data = torch.load(out / "checkpoint" / "data.pt")
    chat_ids = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)
    for row, ids in enumerate([tokenizer(PROMPTS[0]).input_ids, chat_ids["input_ids"],
                               tokenizer(PROMPTS[4]).input_ids]):
        n, length = int(data["prompt_lens"][row]), int(data["lens"][row])
        assert data["seqs"][row, :n].tolist() == ids
        assert data["seqs"][row, n:length].tolist() == _generate(pipeline, ids, 24)

    config = yaml.safe_load(open(checkpoint[2]))
    config["drafter"] = {"method": "dflash", "path": str(out), "schedule": {"mode": "full"}}
    (tmp_path / "dflash.yaml").write_text(yaml.safe_dump(config))
    served = load_pipeline(load_build_config(tmp_path / "dflash.yaml"))
    for prompt in PROMPTS[:4]:
        ids = tokenizer(prompt).input_ids
        assert served.decoder.generate(ids, MAX_TOKENS).token_ids == _generate(pipeline, ids)


@pytest.mark.parametrize("kind", ["bpe", "metaspace", "bytes"])
def test_text_streams_incrementally_what_decoding_all_gives(pipeline, kind):
    """Random ids (special tokens, split multi-byte characters, BPE merges, SentencePiece spaces
    that a piece decoded alone loses) pushed a few at a time: the streamed text is
    `decode(all)`, and with a stop word the stream ends at the first id after which `decode` of
    the ids so far holds it, as decoding everything at every id would."""
    if kind == "metaspace":
        metaspace = metaspace_tokenizer()
        decode = functools.partial(metaspace.decode, skip_special_tokens=True)
    else:
        decode = pipeline.tokenizer.decode if kind == "bpe" else ByteTokenizer().decode
    vocab = 260 if kind == "bytes" else VOCAB
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        stream, pieces, i = TextStream(decode), [], 0
        while i < len(ids):
            n = rng.randint(1, 4)
            pieces.append(stream.push(ids[i : i + n])[0])
            i += n
        assert "".join(pieces) + stream.finish() == decode(ids)

        text = max(decode(ids).split("\ufffd"), key=len)  # a word with no incomplete character in it
        if not text:
            continue
        start = rng.randrange(len(text))
        word = text[start : start + rng.randint(1, 3)]
        end = next(n for n in range(1, len(ids) + 1) if word in decode(ids[:n]))
        stream, streamed, i = TextStream(decode, (word,)), "", 0
        while i < len(ids) and not stream.stopped:
            streamed += stream.push(ids[i : i + 3])[0]
            i += 3
        assert stream.stopped and stream.ids == ids[:end]
        assert streamed + stream.finish() == decode(ids[:end])
