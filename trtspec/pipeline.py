"""A loaded deployment in the torch flavour: tokenizer + target + drafter + decoder.

This is what the CLI, the Triton orchestration model and the benchmarks all call, so the text
they produce for one request is produced by the same code.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from trtspec.config import BuildConfig, EngineConfig
from trtspec.errors import ConfigError
from trtspec.models.drafter import Drafter, build_drafter
from trtspec.models.packed_target import PackedSlots, PackedTarget
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.spec.batch import BatchDecoder
from trtspec.spec.decoder import SpeculativeDecoder
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.sampling import SamplingParams
from trtspec.spec.schedule import SPSTable
from trtspec.tokenizer import ByteTokenizer

if TYPE_CHECKING:
    from trtspec.engine.target import EngineTarget

log = logging.getLogger(__name__)


class TextTokenizer(Protocol):
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int]) -> str: ...


class HFTokenizer:
    """A Hugging Face tokenizer stored beside the target's weights."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.eos_id = self._tok.eos_token_id

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True)


def load_tokenizer(path: Path, hf_config) -> TextTokenizer:
    if getattr(hf_config, "trtspec_special_tokens", None) is not None:
        return ByteTokenizer.from_config(hf_config)
    return HFTokenizer(path)


@dataclass(slots=True)
class Pipeline:
    config: BuildConfig
    tokenizer: TextTokenizer
    target: TargetModel | EngineTarget
    drafter: Drafter
    decoder: SpeculativeDecoder

    def packed_target(self) -> PackedSlots:
        """This pipeline's target as a packed multi-request target (for `BatchDecoder`)."""
        taps = self.target.tap_layer_ids
        if isinstance(self.target, TargetModel):
            return PackedTarget(self.target.model, taps)
        from trtspec.engine.packed_target import EnginePackedTarget

        graph = self.target.graph
        return EnginePackedTarget(graph.session, self.target.config, taps, graph.precision)

    def batch_decoder(self) -> BatchDecoder:
        """A continuous-batching decoder over this pipeline's target, drafter and verifier, with
        the config's verification schedule (DSpark's scheduler loads its SPS table)."""
        schedule, sps = None, None
        drafter = self.config.drafter
        if drafter is not None and self.drafter.num_draft_tokens:
            schedule = drafter.schedule
            if drafter.resolved_sps_table is not None:
                sps = SPSTable.load(drafter.resolved_sps_table)
        return BatchDecoder(self.packed_target(), self.drafter, self.tokenizer.eos_id, schedule, sps,
                            self.decoder.verifier)

    def generate(
        self, prompt: str, max_tokens: int, sampling: SamplingParams | None = None
    ) -> tuple[str, GenerationResult]:
        if not prompt:
            raise ValueError("prompt is empty: give some text to continue")
        limit = self.config.limits.max_tokens
        if not 1 <= max_tokens <= limit:
            raise ValueError(f"max_tokens must be in [1, {limit}], got {max_tokens}")
        result = self.decoder.generate(self.tokenizer.encode(prompt), max_tokens, sampling)
        return self.tokenizer.decode(result.token_ids), result


def load_pipeline(config: BuildConfig, use_drafter: bool = True) -> Pipeline:
    """Load the config's target (and drafter unless `use_drafter` is False): flavour torch in
    torch; flavour engine over onnxruntime sessions of the exported graphs (`trtspec.engine.load`)."""
    if config.flavour == "engine":
        return _load_engine_pipeline(config, use_drafter)
    if config.flavour != "torch":
        raise ConfigError(
            f"flavour {config.flavour!r} cannot run in this command yet; use `flavour: torch` or `engine`"
        )
    drafter_config = config.drafter if use_drafter else None
    model = load_causal_lm(config.target.resolved_path, config.target.dtype)
    tokenizer = load_tokenizer(config.target.resolved_path, model.config)
    # the drafter decides which target layers to tap, so build a bare target first
    target = TargetModel(model)
    drafter = build_drafter(drafter_config, target)
    target = TargetModel(model, drafter.tap_layer_ids)
    verifier = None
    if config.test_only is not None and config.test_only.biased_acceptance:
        from trtspec.spec.biased_verify import BiasedVerifier

        log.warning("config %r: test_only.biased_acceptance, sampling is deliberately biased", config.name)
        verifier = BiasedVerifier()
    decoder = SpeculativeDecoder(target, drafter, tokenizer.eos_id, verifier)
    return Pipeline(config, tokenizer, target, drafter, decoder)


def _load_engine_pipeline(config: BuildConfig, use_drafter: bool) -> Pipeline:
    from transformers import AutoConfig

    from trtspec.engine.load import load_engine_models

    engine = config.engine or EngineConfig()
    target, drafter, verifier = load_engine_models(config, use_drafter, folder=engine.resolved_folder,
                                                   backend=engine.backend)
    hf_config = AutoConfig.from_pretrained(config.target.resolved_path, local_files_only=True)
    tokenizer = load_tokenizer(config.target.resolved_path, hf_config)
    decoder = SpeculativeDecoder(target, drafter, tokenizer.eos_id, verifier)
    return Pipeline(config, tokenizer, target, drafter, decoder)
