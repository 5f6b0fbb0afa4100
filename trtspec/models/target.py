"""The target model p: a Hugging Face causal LM with a rewindable KV cache and hidden-state taps.

One `forward` returns the logits of every fed position and, in the same pass, the hidden states
of the layers a drafter reads (`tap_layer_ids`; layer i's output is `hidden_states[i + 1]`
because index 0 is the embedding output). The KV cache holds exactly the committed tokens:
after verification the loop calls `rewind(num_rejected)`, a non-negative count of slots.
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, PreTrainedModel
from transformers.utils import logging as hf_logging

from trtspec.errors import CheckpointError

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral", "qwen3_moe")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def check_checkpoint_dir(path: Path) -> dict:
    """Refuse a directory that is not a loadable HF checkpoint; return its config.json."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file} is missing: not a Hugging Face checkpoint directory")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{config_file} is not valid JSON: {exc}") from None
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise CheckpointError(
            f"{path} has no weights (*.safetensors or pytorch_model*.bin); "
            "copy the model's weight files next to its config.json"
        )
    return config


def load_causal_lm(path: Path, dtype: str = "float32") -> PreTrainedModel:
    """Load a causal LM from a local checkpoint directory, never from a hub."""
    config = check_checkpoint_dir(path)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{path / 'config.json'}: model_type {model_type!r} is not supported; "
            f"expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    hf_logging.disable_progress_bar()
    hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        path, config=hf_config, dtype=DTYPES[dtype], local_files_only=True
    )
    return model.eval()


def cache_argument(model: PreTrainedModel) -> str:
    """The name of `model.forward`'s KV-cache argument: `cache` in recent transformers 5.x,
    `past_key_values` in 5.17 (the GPU image's), which silently ignores an unknown `cache`."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@dataclass(slots=True)
class TargetOutput:
    logits: torch.Tensor  # [b, s, V] for the fed positions
    hidden: torch.Tensor | None  # [b, s, n_taps * H] concatenated taps, None without taps


class TargetModel:
    """Stateful wrapper: feed tokens, get logits + taps; the cache grows; rewind drops slots."""

    def __init__(self, model: PreTrainedModel, tap_layer_ids: tuple[int, ...] = ()):
        self.model = model
        self.config = model.config
        num_layers = model.config.num_hidden_layers
        for i in tap_layer_ids:
            if not 0 <= i < num_layers:
                raise ValueError(
                    f"tap layer {i} is out of range for a target with {num_layers} layers"
                )
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.cache = DynamicCache()
        self.num_forwards = 0
        self.cache_argument = cache_argument(model)

    @classmethod
    def from_pretrained(cls, path: Path, dtype: str = "float32", tap_layer_ids=()) -> TargetModel:
        return cls(load_causal_lm(path, dtype), tap_layer_ids)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def seq_len(self) -> int:
        """Tokens held in the KV cache."""
        return self.cache.get_seq_length()

    def reset(self) -> None:
        self.cache = DynamicCache()
        self.num_forwards = 0

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> TargetOutput:
        """Feed `input_ids` [b, s] after the cached tokens; return their logits and taps."""
        out = self.model(
            input_ids=input_ids,
            **{self.cache_argument: self.cache},
            use_cache=True,
            output_hidden_states=bool(self.tap_layer_ids),
            logits_to_keep=1 if last_only else 0,
        )
        self.num_forwards += 1
        hidden = None
        if self.tap_layer_ids:
            hidden = torch.cat([out.hidden_states[i + 1] for i in self.tap_layer_ids], dim=-1)
        return TargetOutput(logits=out.logits, hidden=hidden)

    def rewind(self, num_rejected: int) -> None:
        """Drop the last `num_rejected` cached slots (the rejected draft positions)."""
        if num_rejected < 0:
            raise ValueError(f"rewind takes a non-negative count of slots, got {num_rejected}")
        if num_rejected > self.seq_len:
            raise ValueError(f"cannot rewind {num_rejected} slots from a cache of {self.seq_len}")
        if num_rejected:
            self.cache.crop(-num_rejected)
