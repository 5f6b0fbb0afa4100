"""Byte-level tokenizer of the embedded models: ids 0–255 are raw bytes, specials come after.

The special ids are stored in the model's `config.json` under `trtspec_special_tokens`, so a
checkpoint says which of its ids are which; `ByteTokenizer.from_config` reads them back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def config_entries(self) -> dict:
        """What to put in a model's `config.json` so `from_config` can read it back."""
        return {
            "trtspec_special_tokens": dict(self.specials),
            "eos_token_id": self.specials["eos"],
            "pad_token_id": self.specials["pad"],
            "bos_token_id": self.specials["bos"],
        }
