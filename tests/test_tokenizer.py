"""trtspec.tokenizer: ByteTokenizer's special ids, which a byte-level checkpoint's config.json names,
read back only where they are a map of ids past the 256 bytes and inside the vocabulary; and the
bytes a Hugging Face tokenizer's piece stands for (byte-level BPE's alphabet, SentencePiece's byte
ids), as OpenAI's logprobs `bytes` carry them."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken
from transformers.convert_slow_tokenizer import bytes_to_unicode

from trtspec.tokenizer import _BYTE_OF_CHAR, DEFAULT_SPECIALS, ByteTokenizer, HFTokenizer

from .bpe_checkpoint import bpe_tokenizer, byte_fallback_tokenizer


def test_special_ids_lie_past_the_bytes_and_inside_the_vocabulary():
    # [256, vocab_size): 256 and vocab_size - 1 are the first and last ids a special may have
    assert ByteTokenizer({"eos": 256, "pad": 263}, vocab_size=264).specials == {"eos": 256, "pad": 263}
    for idx in (255, 264):
        with pytest.raises(ValueError, match=rf"special token 'eos' has id {idx}; .* \[256, 264\)"):
            ByteTokenizer({"eos": idx}, vocab_size=264)


def test_from_config_reads_the_checkpoints_specials_back(tiny_target_config):
    tokenizer = ByteTokenizer.from_config(tiny_target_config)
    assert tokenizer.specials == DEFAULT_SPECIALS and tokenizer.vocab_size == tiny_target_config.vocab_size
    assert tokenizer.eos_id == 256


@pytest.mark.parametrize("specials", [
    ["eos"],  # no map
    {"pad": 257},  # no eos
    {"eos": True},  # a boolean is no id (True would be the byte 1)
    {"eos": "256"},
])
def test_from_config_refuses_specials_that_are_no_map_of_ids_with_eos(specials, tiny_target_config):
    tiny_target_config.trtspec_special_tokens = specials
    with pytest.raises(ValueError, match="trtspec_special_tokens must map each special token.s name"):
        ByteTokenizer.from_config(tiny_target_config)


def test_from_config_of_a_config_without_specials_says_to_give_a_tokenizer(tiny_target_config):
    del tiny_target_config.trtspec_special_tokens
    with pytest.raises(ValueError, match="not a trtspec byte-level model"):
        ByteTokenizer.from_config(tiny_target_config)


def test_a_special_ids_bytes_are_its_name_and_an_unnamed_ids_its_number():
    # DEFAULT_SPECIALS name 256 to 259; 263 is inside the vocabulary but no special's
    tokenizer = ByteTokenizer()
    assert [tokenizer.token_bytes(i) for i in (65, 256, 258, 263)] == \
        [b"A", b"<|eos|>", b"<|mask|>", b"<|263|>"]


def test_the_byte_level_alphabet_is_gpt2s():
    """Byte-level BPE spells each byte as one printable character (GPT-2's map, which Llama 3's and
    Qwen's tokenizers share): `raw_bytes` reads pieces back through its inverse, all 256 bytes, the
    last printable ones (0xFE 'þ', 0xFF 'ÿ') too."""
    assert _BYTE_OF_CHAR == {char: byte for byte, char in bytes_to_unicode().items()}


def test_raw_bytes_are_what_a_piece_stands_for_and_a_specials_its_text(tmp_path):
    """OpenAI's logprobs `bytes`: a SentencePiece byte id `<0xE2>` is the byte 0xE2 (decoded alone it
    is U+FFFD), a "▁" piece a space; in byte-level BPE "Ġ" is a space. A special token is its text
    as decoded, even where its name is spelt in the byte alphabet ("é" would be the byte 0xE9)."""
    fallback = byte_fallback_tokenizer()
    fallback.save_pretrained(tmp_path / "sentencepiece")
    spelt = HFTokenizer(tmp_path / "sentencepiece", len(fallback))
    e2, word = fallback.convert_tokens_to_ids(["<0xE2>", "▁label"])
    assert (spelt.raw_bytes(e2), spelt.token_bytes(e2)) == (b"\xe2", "\ufffd".encode())
    assert spelt.raw_bytes(word) == b" label"

    bpe, _ = bpe_tokenizer()
    bpe.add_tokens([AddedToken("<|café|>", special=True)])
    bpe.save_pretrained(tmp_path / "bpe")
    byte_level = HFTokenizer(tmp_path / "bpe", len(bpe))
    cafe, word = bpe.convert_tokens_to_ids(["<|café|>", "Ġfinal"])
    assert byte_level.raw_bytes(cafe) == byte_level.token_bytes(cafe) == "<|caf\ufffd|>".encode()
    assert byte_level.raw_bytes(word) == b" final"
