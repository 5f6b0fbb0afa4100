"""Tokenizers of targets, and the ids that end generation.

- `ByteTokenizer`: the embedded models' byte-level one: ids 0–255 are raw bytes, specials come
  after. The special ids are stored in the model's `config.json` under `trtspec_special_tokens`,
  so a checkpoint says which of its ids are which; `ByteTokenizer.from_config` reads them back.
- `HFTokenizer`: a Hugging Face tokenizer stored beside a target's weights (every Hub checkpoint).
- `end_ids_of`: what ends a request, the tokenizer's end of sequence and generation_config.json's.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from trtspec.errors import CheckpointError
from trtspec.models.checkpoint import read_end_ids

NUM_BYTES = 256
DEFAULT_SPECIALS = {"eos": 256, "pad": 257, "mask": 258, "bos": 259}
DEFAULT_VOCAB_SIZE = 264  # 256 bytes + specials, padded to a multiple of 8


@dataclass(slots=True)
class ByteTokenizer:
    """Encodes text as its UTF-8 bytes; decodes ids < 256 back, dropping special ids."""

    specials: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_SPECIALS))
    vocab_size: int = DEFAULT_VOCAB_SIZE

    def __post_init__(self) -> None:
        for name, idx in self.specials.items():
            if not NUM_BYTES <= idx < self.vocab_size:
                raise ValueError(
                    f"special token {name!r} has id {idx}; byte-level specials must lie in "
                    f"[{NUM_BYTES}, {self.vocab_size})"
                )

    @classmethod
    def from_config(cls, config) -> ByteTokenizer:
        """Build from a transformers config that carries `trtspec_special_tokens`."""
        specials = getattr(config, "trtspec_special_tokens", None)
        if specials is None:
            raise ValueError(
                "model config has no `trtspec_special_tokens`: it is not a trtspec byte-level "
                "model, so give a tokenizer directory instead"
            )
        if not isinstance(specials, dict) or "eos" not in specials or not all(
                isinstance(idx, int) and not isinstance(idx, bool) for idx in specials.values()):
            raise ValueError(f"trtspec_special_tokens must map each special token's name to its id, eos "
                             f"among them; got {specials!r}")
        return cls(specials=dict(specials), vocab_size=config.vocab_size)

    @property
    def eos_id(self) -> int:
        return self.specials["eos"]

    @property
    def mask_id(self) -> int:
        return self.specials["mask"]

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The text's bytes; a byte-level model's prompts carry no special tokens (the flag is
        `TextTokenizer`'s, for the Hugging Face tokenizers that add a BOS)."""
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < NUM_BYTES).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """One id's own bytes (a special id: its name, as `<|eos|>`)."""
        if token_id < NUM_BYTES:
            return bytes((token_id,))
        name = next((n for n, i in self.specials.items() if i == token_id), str(token_id))
        return f"<|{name}|>".encode()

    def raw_bytes(self, token_id: int) -> bytes:
        return self.token_bytes(token_id)

    def config_entries(self) -> dict:
        """What to put in a model's `config.json` so `from_config` can read it back."""
        return {
            "trtspec_special_tokens": dict(self.specials),
            "eos_token_id": self.specials["eos"],
            "pad_token_id": self.specials["pad"],
            "bos_token_id": self.specials["bos"],
        }


def _bytes_to_chars() -> dict[str, int]:
    """GPT-2's byte-level alphabet: each byte as a printable character (the printable bytes as
    themselves, the others from U+0100 on), which byte-level BPE pieces are spelt in."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    return {chr(b if b in printable else next(extra)): b for b in range(256)}


_BYTE_OF_CHAR = _bytes_to_chars()


class TextTokenizer(Protocol):
    eos_id: int | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...
    def token_bytes(self, token_id: int) -> bytes: ...  # one id's text as a log-probability names it
    def raw_bytes(self, token_id: int) -> bytes: ...  # the bytes one id stands for


class HFTokenizer:
    """A Hugging Face tokenizer stored beside the target's weights.

    `encode` adds the tokenizer's own special tokens (Llama 3's `<|begin_of_text|>`) as
    `tokenizer(text)`, vLLM's and TensorRT-LLM's completions do; a rendered chat template already
    holds them, so chat prompts are encoded with `add_special_tokens=False`."""

    def __init__(self, path: Path, vocab_size: int):
        from transformers import AutoTokenizer

        missing = (f"{path} has no tokenizer that loads (tokenizer.json, tokenizer.model or vocab.json + "
                   "merges.txt): copy the checkpoint's tokenizer files beside its weights")
        try:
            self.hf = AutoTokenizer.from_pretrained(path, local_files_only=True)  # its chat template too
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds for a bad folder
            raise CheckpointError(f"{missing}; transformers says: {' '.join(str(exc).split())}") from None
        # transformers 5 builds an empty tokenizer from a folder that has no tokenizer files
        if len(self.hf) < 2 or not self.hf.encode("Hello, world", add_special_tokens=False):
            raise CheckpointError(missing)
        if len(self.hf) > vocab_size:
            raise CheckpointError(f"{path}: the tokenizer has {len(self.hf)} tokens but config.json's "
                                  f"vocab_size is {vocab_size}: they are not the same model's")
        self.eos_id = self.hf.eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=True)

    def token_bytes(self, token_id: int) -> bytes:
        """One id decoded alone, special tokens shown (`<|eot_id|>`), as vLLM names log-probabilities'
        tokens; a piece of a multi-byte character decodes to U+FFFD, as there."""
        return self.hf.decode([token_id], skip_special_tokens=False).encode("utf-8")

    def raw_bytes(self, token_id: int) -> bytes:
        """The bytes an id stands for, a piece of a character's too (OpenAI's logprobs `bytes`, which
        a client joins to rebuild the text): a byte-level BPE's (GPT-2's byte-to-character map,
        Llama 3's, Qwen's) and a byte-fallback SentencePiece's (`<0xE2>`, `▁` a space); other
        tokenizers' and special tokens: `token_bytes`."""
        piece = self.hf.convert_ids_to_tokens(token_id)
        if piece is None or token_id in self._specials:
            return self.token_bytes(token_id)
        if self._decoder == "byte_level" and all(c in _BYTE_OF_CHAR for c in piece):
            return bytes(_BYTE_OF_CHAR[c] for c in piece)
        if self._decoder == "byte_fallback":
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes((int(piece[3:5], 16),))
            return piece.replace("\u2581", " ").encode("utf-8")
        return self.token_bytes(token_id)

    @functools.cached_property
    def _specials(self) -> frozenset[int]:
        return frozenset(self.hf.all_special_ids) | frozenset(
            i for i, token in self.hf.added_tokens_decoder.items() if token.special)

    @functools.cached_property
    def _decoder(self) -> str | None:
        """How the tokenizer's decoder turns pieces into bytes: 'byte_level', 'byte_fallback' or None."""
        spec = json.loads(self.hf.backend_tokenizer.to_str()).get("decoder") or {}
        kinds = {d.get("type") for d in spec.get("decoders", [spec])}
        return "byte_level" if "ByteLevel" in kinds else "byte_fallback" if "ByteFallback" in kinds else None


def load_tokenizer(path: Path, hf_config) -> TextTokenizer:
    if getattr(hf_config, "trtspec_special_tokens", None) is not None:
        return ByteTokenizer.from_config(hf_config)
    return HFTokenizer(path, hf_config.vocab_size)


def end_ids_of(path: Path, tokenizer: TextTokenizer, vocab_size: int) -> tuple[int, ...]:
    """What ends a request, as `generate` and vLLM end it: the tokenizer's end of sequence, then
    every other `eos_token_id` of the checkpoint's generation_config.json (config.json's without one)."""
    own = () if tokenizer.eos_id is None else (tokenizer.eos_id,)
    return tuple(dict.fromkeys(own + read_end_ids(path, vocab_size)))
