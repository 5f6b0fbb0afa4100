"""A target with a SentencePiece tokenizer, laid out as Llama-2-7b-chat is
(`tests/bpe_checkpoint.py`'s `write_sentencepiece_target`): its decoder strips the space a text
starts with, so a word's piece decoded alone (`▁w`) loses the space it has after the prompt. An
answer's text is the prompt's continuation, `decode(prompt + answer)` past `decode(prompt)`, in
process and served, whole and streamed, as transformers' and vLLM's texts are; with echo the
prompt's text and then the answer's, every token's `text_offset` where its text begins.

Found fuzzing SentencePiece checkpoints (2026-12-06): every answer whose first piece began a word
lost that word's space ("Hello" + `▁w` answered "w w w", echo "Hellow w w"), and with echo
every prompt token's offset was one character early where decoding the prompt strips a space.
"""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from transformers import AutoTokenizer

from trtspec.cli import main
from trtspec.config import load_build_config
from trtspec.pipeline import load_pipeline

from .bpe_checkpoint import write_sentencepiece_target
from .conftest import serve_cli

PROMPTS = ["Hello", "The answer is", " Hello world", "def f(x):", "2 + 2 =", "  two leading spaces"]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentencepiece")
    write_sentencepiece_target(root / "target", root / "draft")
    config = {"name": "sp", "flavour": "torch", "target": {"path": str(root / "target")},
              "drafter": {"method": "draft_model", "path": str(root / "draft"), "num_draft_tokens": 4},
              "limits": {"max_tokens": 64}}
    (root / "sp.yaml").write_text(yaml.safe_dump(config))
    tokenizer = AutoTokenizer.from_pretrained(root / "target", local_files_only=True)
    return str(root / "sp.yaml"), tokenizer


@pytest.fixture(scope="module")
def pipeline(checkpoint):
    return load_pipeline(load_build_config(checkpoint[0]))


def _continuation(tokenizer, prompt_ids: list[int], ids: list[int]) -> str:
    """transformers' text of `ids` after the prompt: decode(prompt + ids) past decode(prompt)."""
    before = tokenizer.decode(prompt_ids, skip_special_tokens=True)
    whole = tokenizer.decode(prompt_ids + ids, skip_special_tokens=True)
    assert whole.startswith(before)
    return whole[len(before):]


def _piece_texts(tokenizer, ids: list[int], first: bool) -> list[str | None]:
    """Each id's text where it stands in its text: its piece, `▁` a space (the text's `first` piece
    without it, as the decoder strips it); None for special and byte ids."""
    texts: list[str | None] = []
    for piece in tokenizer.convert_ids_to_tokens(ids):
        if piece in tokenizer.all_special_tokens or piece.startswith("<0x"):
            texts.append(None)
            continue
        text = piece.replace("▁", " ")
        texts.append(text[1:] if first and text.startswith(" ") else text)
        first = False
    return texts


def test_an_answer_continues_the_prompts_text(checkpoint, pipeline):
    """In process (`generate`, `chat`): an answer whose first piece starts a word starts with its
    space, as decoding the prompt and the answer together gives it."""
    _, tokenizer = checkpoint
    spaced = compared = 0
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        chat_ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        answers = ((pipeline.generate(prompt, MAX_TOKENS), tokenizer(prompt).input_ids),
                   (pipeline.chat(messages, MAX_TOKENS), chat_ids["input_ids"]))
        for (text, result), prompt_ids in answers:
            ends = [i for i, token in enumerate(result.token_ids) if token in pipeline.end_ids]
            answer = result.token_ids[: ends[0]] if ends else result.token_ids
            want = _continuation(tokenizer, prompt_ids, answer)
            if "\ufffd" not in want:  # (else a run of byte ids streams otherwise: test_text_fidelity)
                assert text == want, prompt
                compared += 1
            spaced += text.startswith(" ")
    assert compared >= 8 and spaced >= 2  # some answers began a word: the cases this test is about


def test_served_answers_and_echo_offsets_continue_the_prompt(checkpoint, pipeline, tmp_path):
    """Served over the OpenAI API: completions whole and streamed and chat are the answers in
    process; with echo the text is the prompt and then the answer, and each token's text_offset
    is where its text (its piece, `▁` a space) begins in it."""
    config, tokenizer = checkpoint
    assert CliRunner().invoke(main, ["build", config, "--out", str(tmp_path)]).exit_code == 0
    with serve_cli(tmp_path) as served:
        client = served.client()
        for prompt in PROMPTS:
            want, result = pipeline.generate(prompt, MAX_TOKENS)
            ask = {"model": "sp", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
            assert client.completions.create(**ask).choices[0].text == want, prompt
            streamed = client.completions.create(**ask, stream=True)
            assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == want, prompt
            echoed = client.completions.create(**ask, echo=True, logprobs=0).choices[0]
            assert echoed.text == prompt + want, prompt
            prompt_ids = tokenizer(prompt).input_ids
            texts = _piece_texts(tokenizer, prompt_ids, True)
            texts += _piece_texts(tokenizer, result.token_ids, False)
            offsets = echoed.logprobs.text_offset
            assert len(offsets) == len(texts)
            for k, (text, offset) in enumerate(zip(texts, offsets, strict=True)):
                assert text is None or echoed.text[offset:].startswith(text), (prompt, k, text, offset)
            messages = [{"role": "user", "content": prompt}]
            chat = client.chat.completions.create(model="sp", messages=messages, max_tokens=MAX_TOKENS,
                                                  temperature=0)
            assert chat.choices[0].message.content == pipeline.chat(messages, MAX_TOKENS)[0], prompt


def test_verify_reads_a_served_texts_ids_after_its_prompt(pipeline):
    """`verify` over openai:// audits a served text by the ids it stands for: tokenized after the
    prompt, not alone (alone it gained a BOS the audit judged as the first answer token, and a
    SentencePiece answer's first word its own '▁')."""
    from trtspec.triton.verify import answer_ids

    tokenizer = pipeline.tokenizer
    for prompt in PROMPTS:
        prompt_ids = tokenizer.encode(prompt)
        text, result = pipeline.generate(prompt, MAX_TOKENS)
        ids = answer_ids(tokenizer, prompt, prompt_ids, text)
        assert ids[:1] != [tokenizer.hf.bos_token_id]
        if "\ufffd" not in text:  # the ids read back as the text, after the prompt
            before = tokenizer.decode(prompt_ids)
            assert tokenizer.decode(prompt_ids + ids)[len(before):] == text, prompt
