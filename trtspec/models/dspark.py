"""DSpark drafter network (DeepSeek, deepseek-ai/DeepSpec), in DeepSpec's checkpoint layout.

- Parallel backbone = the DFlash drafter (`DFlashDraftModel`: fc + hidden_norm over the target's
  taps, KV injection in every layer, one pass per block), with the anchor as the FIRST
  prediction position: the block `[x_0 = anchor, MASK × (γ−1)]` at positions a..a+γ−1 gives γ
  hidden states h_1..h_γ and base logits `U_k = lm_head(h_k)`, where slot k predicts x_{a+k}.
- Markov head (DeepSpec `markov_head_type`, `trtspec.models.markov`): `p_k(v) ∝ exp(U_k(v) + B_k(v))`
  with B_k from x_{k−1} (vanilla: `W2(W1[x_{k−1}])`; gated: W1[x_{k−1}] gated by h_k; rnn: a
  recurrent state over x_0..x_{k−1}); sampled left to right from x_0 = the anchor, so each draft
  sees the one drafted before it.
- Confidence head (DeepSpec `AcceptRatePredictor`): `c_k = σ(proj([h_k ; W1[x_{k−1}]]))`, the
  probability that slot k is accepted given slots < k were.

DeepSpec's model carries its own copies of the target's `embed_tokens` and `lm_head` (copied at
initialisation and frozen), so they are part of the checkpoint. State-dict names (no `model.`
prefix, as DeepSpec's `save_pretrained` writes them): the DFlash names (`fc`, `hidden_norm`,
`layers.{i}.*`, `norm`) plus `embed_tokens`, `lm_head`, `markov_head.markov_w1`,
`markov_head.markov_w2` (+ `markov_head.gate_proj.*` for gated, `markov_head.joint_proj.*` for rnn),
`confidence_head.proj.{weight,bias}`. Config fields (DeepSpec
`build_draft_config`): `architectures: ["Qwen3DSparkModel"]`, `block_size`, `mask_token_id`,
`target_layer_ids`, `num_target_layers`, `num_anchors`, `markov_rank`, `markov_head_type`,
`enable_confidence_head`, `confidence_head_with_markov`, plus the target's Qwen3 fields.

Other exporters spell the same fields differently: nested in `dspark_config` or in `dflash_config`
(SpecForge), or top-level with a `dspark_` prefix (`dspark_block_size`, `dspark_noise_token_id`
for the mask id: DeepSeek-V4-Flash-DSpark, sglang). `dspark_fields` reads all four, in the order
TensorRT-LLM reads them, and refuses a checkpoint whose spellings disagree, since servers that
prefer different spellings would then run different drafters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import Qwen3Config

from trtspec.errors import CheckpointError
from trtspec.models.checkpoint import (
    bool_field,
    cast_keeping_rope,
    check_weights_fit,
    int_field,
    int_list_field,
    load_weights,
    object_field,
    read_checkpoint,
    weight_shapes,
    write_checkpoint,
)
from trtspec.models.dflash import DFlashDraftModel, DFlashSpec, check_block_drafter_fits
from trtspec.models.markov import MARKOV_HEAD_TENSORS, MARKOV_HEADS, MarkovState
from trtspec.models.target import check_config_values
from trtspec.trtllm.fields import DSPARK_DRAFT_KEYS

ARCHITECTURE = "Qwen3DSparkModel"
MARKOV_HEAD_TYPES = tuple(MARKOV_HEADS)  # DeepSpec's build_markov_head: vanilla, gated, rnn
DSPARK_FIELDS = ("block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "num_anchors",
                 "markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov")


def dspark_spellings(key: str) -> tuple[tuple[str | None, str], ...]:
    """(section, name) pairs where `key` may sit, in TensorRT-LLM's order; section None = top level."""
    prefixed = DSPARK_DRAFT_KEYS.get(key, f"dspark_{key}")
    return (("dspark_config", key), ("dflash_config", key), (None, prefixed), (None, key))


def dspark_fields(raw: dict, where: str) -> dict:
    """The DSpark fields of config.json `raw` under one spelling each (plain names, DeepSpec's);
    a CheckpointError naming both spellings when two of them give different values."""
    for section in ("dspark_config", "dflash_config"):  # one that is no object was passed over unread
        object_field(raw, section, where, "an object of DSpark fields")
    found: dict = {}
    for key in DSPARK_FIELDS:
        spelled: list[tuple[str, object]] = []
        for section, name in dspark_spellings(key):
            values = raw if section is None else raw.get(section)
            if isinstance(values, dict) and name in values:
                spelled.append((name if section is None else f"{section}.{name}", values[name]))
        for name, value in spelled[1:]:
            if value != spelled[0][1]:
                raise CheckpointError(
                    f"{where}: DSpark {key} is given twice with different values, "
                    f"{spelled[0][0]} = {spelled[0][1]!r} and {name} = {value!r}; servers that read "
                    "different spellings would run different drafters: keep one"
                )
        if spelled:
            _check_type(key, *spelled[0], where)
            found[key] = spelled[0][1]
    return found


def _check_type(key: str, name: str, value: object, where: str) -> None:
    """A DSpark field's value is of its type, or a CheckpointError naming it as config.json spells it
    (TensorRT-LLM's conversion copied "false", 2.5 and "135" into the deployment as they were)."""
    if key == "target_layer_ids":
        int_list_field({name: value}, name, where, "DSpark")
    elif key in ("enable_confidence_head", "confidence_head_with_markov"):
        bool_field({name: value}, name, where)
    elif key == "markov_head_type":
        if value is not None and not isinstance(value, str):
            raise CheckpointError(f"{where}: {name} must be a head type's name, got {value!r}")
    else:
        int_field({name: value}, name, where, "DSpark")


@dataclass(slots=True)
class DSparkSpec(DFlashSpec):
    """The DSpark fields of a checkpoint's config.json. `block_size` is γ: inputs = drafts."""

    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    enable_confidence_head: bool = True
    confidence_head_with_markov: bool = True
    num_anchors: int = 512  # training-only in DeepSpec; kept so a round trip is faithful

    @classmethod
    def from_config_dict(cls, raw: dict, where: str) -> DSparkSpec:
        raw = dspark_fields(raw, where)
        if "enable_confidence_head" not in raw:
            raise CheckpointError(f"{where}: missing DSpark field 'enable_confidence_head'")
        spec = cls(
            block_size=int_field(raw, "block_size", where, "DSpark"),
            mask_token_id=int_field(raw, "mask_token_id", where, "DSpark"),
            target_layer_ids=int_list_field(raw, "target_layer_ids", where, "DSpark"),
            num_target_layers=int_field(raw, "num_target_layers", where, "DSpark"),
            markov_rank=int_field(raw, "markov_rank", where, "DSpark"),
            enable_confidence_head=bool_field(raw, "enable_confidence_head", where),
            num_anchors=int_field(raw, "num_anchors", where, "DSpark", default=512),
        )
        # DeepSpec writes these two only when the head they qualify exists
        if spec.markov_rank > 0:
            spec.markov_head_type = str(raw.get("markov_head_type", "vanilla")).lower()
        spec.confidence_head_with_markov = spec.enable_confidence_head and bool_field(
            raw, "confidence_head_with_markov", where)
        return spec


class ConfidenceHead(nn.Module):
    """c_k logit = wᵀ[h_k ; W1[x_{k−1}]] + b (DeepSpec `AcceptRatePredictor`)."""

    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


# picks x_k from the Markov-corrected logits of slot k: (k, logits [b, V]) -> tokens [b]
ChooseToken = Callable[[int, torch.Tensor], torch.Tensor]


@dataclass(slots=True)
class DraftBlock:
    tokens: torch.Tensor  # [b, k] x_1..x_k
    logits: torch.Tensor  # [b, k, V] Markov-corrected logits of p_1..p_k (before sampling params)
    confidence_logits: torch.Tensor | None  # [b, k] logit of c_k; None without a confidence head


class DSparkDraftModel(DFlashDraftModel):
    """DFlash backbone + own copies of the target's embedding/LM head + Markov and confidence heads."""

    def __init__(self, config: Qwen3Config, spec: DSparkSpec):
        super().__init__(config, spec)
        hidden, vocab = config.hidden_size, config.vocab_size
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.markov_head = None
        if spec.markov_rank > 0:
            self.markov_head = MARKOV_HEADS[spec.markov_head_type](vocab, spec.markov_rank, hidden)
        self.confidence_head = None
        if spec.enable_confidence_head:
            extra = spec.markov_rank if spec.confidence_head_with_markov else 0
            self.confidence_head = ConfidenceHead(hidden + extra)

    def markov_state(self, shape: tuple[int, ...], like: torch.Tensor) -> MarkovState:
        """The Markov head's state before slot 1 for `shape` paths (None: a memoryless head)."""
        return None if self.markov_head is None else self.markov_head.initial_state(shape, like)

    def markov_logits(self, base_logits: torch.Tensor, prev_tokens: torch.Tensor, hidden: torch.Tensor,
                      state: MarkovState = None) -> tuple[torch.Tensor, MarkovState]:
        """One slot: U_k + B_k and the head's state after it.  base_logits [..., V]; prev_tokens [...];
        hidden [..., H] (h_k); state [..., r] | None -> ([..., V], state)"""
        if self.markov_head is None:
            return base_logits, None
        bias, state = self.markov_head.step(prev_tokens, hidden, state)
        return base_logits + bias.to(base_logits.dtype), state

    def confidence_logits(self, hidden: torch.Tensor, prev_tokens: torch.Tensor) -> torch.Tensor | None:
        """Logit of c_k.  hidden [..., H]; prev_tokens [...] -> [...] (float32), None without a head."""
        if self.confidence_head is None:
            return None
        features = hidden
        if self.spec.confidence_head_with_markov:
            features = torch.cat([hidden, self.markov_head.markov_w1(prev_tokens).to(hidden.dtype)], -1)
        return self.confidence_head(features).float()

    def teacher_forced(self, hidden: torch.Tensor, prev_tokens: torch.Tensor):
        """Training view: every slot sees the true x_{k−1}.
        hidden [..., γ, H]; prev_tokens [..., γ] -> (logits [..., γ, V], confidence logits [..., γ] | None)"""
        logits = self.lm_head(hidden)
        if self.markov_head is not None:
            logits = logits + self.markov_head.teacher_forced(prev_tokens, hidden).to(logits.dtype)
        return logits, self.confidence_logits(hidden, prev_tokens)

    def decode_block(self, hidden: torch.Tensor, anchor: torch.Tensor, choose: ChooseToken) -> DraftBlock:
        """Inference view: left to right from x_0 = anchor, each slot conditioned on the token
        `choose` picked for the slot before.  hidden [b, k, H]; anchor [b] -> DraftBlock"""
        base = self.lm_head(hidden)  # [b, k, V]; one parallel product, then k cheap r×V steps
        prev, tokens, logits, prevs = anchor, [], [], []
        state = self.markov_state(anchor.shape, hidden)  # [b, r] | None
        for k in range(hidden.shape[1]):
            step, state = self.markov_logits(base[:, k], prev, hidden[:, k], state)  # [b, V]
            prevs.append(prev)
            prev = choose(k, step)
            tokens.append(prev)
            logits.append(step)
        prev_tokens = torch.stack(prevs, 1)  # [b, k] x_0..x_{k−1}
        return DraftBlock(torch.stack(tokens, 1), torch.stack(logits, 1),
                          self.confidence_logits(hidden, prev_tokens))


# -- checkpoint layout ------------------------------------------------------------------------

def dspark_config_dict(config: Qwen3Config, spec: DSparkSpec) -> dict:
    raw = config.to_dict()
    for key in ("trtspec_special_tokens", "transformers_version", "output_hidden_states"):
        raw.pop(key, None)
    raw.update(
        architectures=[ARCHITECTURE],
        model_type="qwen3",
        tie_word_embeddings=False,
        layer_types=["full_attention"] * config.num_hidden_layers,
        block_size=spec.block_size,
        mask_token_id=spec.mask_token_id,
        target_layer_ids=spec.target_layer_ids,
        num_target_layers=spec.num_target_layers,
        num_anchors=spec.num_anchors,
        markov_rank=spec.markov_rank,
        enable_confidence_head=spec.enable_confidence_head,
    )
    if spec.markov_rank > 0:
        raw["markov_head_type"] = spec.markov_head_type
    if spec.enable_confidence_head:
        raw["confidence_head_with_markov"] = spec.confidence_head_with_markov
    return raw


def save_dspark(model: DSparkDraftModel, out_dir: Path) -> None:
    write_checkpoint(model, dspark_config_dict(model.config, model.spec), out_dir)


def check_dspark_fits(spec: DSparkSpec, config: Qwen3Config, target_config, where: str) -> None:
    """Refuse a drafter that does not fit its target, naming the field and both values (DeepSpec
    also allows tap layer -1, the embedding output; TargetModel taps decoder layers only)."""
    check_block_drafter_fits(spec, config, target_config, where, same_vocab=True)


def _check_spec(spec: DSparkSpec, where: str) -> None:
    if spec.block_size < 1:
        raise CheckpointError(f"{where}: block_size is {spec.block_size}; DSpark needs at least 1")
    if spec.markov_rank < 0:
        raise CheckpointError(f"{where}: markov_rank is {spec.markov_rank}; expected >= 0")
    if spec.markov_rank > 0 and spec.markov_head_type not in MARKOV_HEAD_TYPES:
        raise CheckpointError(
            f"{where}: markov_head_type is {spec.markov_head_type!r}; this build supports "
            f"{', '.join(MARKOV_HEAD_TYPES)}"
        )
    if spec.confidence_head_with_markov and spec.markov_rank == 0:
        raise CheckpointError(f"{where}: confidence_head_with_markov is true but markov_rank is 0")


def _check_markov_tensors(spec: DSparkSpec, held: set[str], path: Path, config_file: Path) -> None:
    """The Markov head's tensors agree with markov_head_type: a gated or RNN checkpoint read as
    another type would otherwise fail as an anonymous layout mismatch (or, read as vanilla
    with the extra tensors ignored, draft from a different distribution than it was trained on)."""
    if spec.markov_rank == 0:
        return
    declared = spec.markov_head_type
    for head_type, names in MARKOV_HEAD_TENSORS.items():
        present = [f"markov_head.{n}" for n in names if f"markov_head.{n}" in held]
        if head_type == declared:
            missing = [f"markov_head.{n}" for n in names if f"markov_head.{n}" not in held]
            if missing:
                raise CheckpointError(
                    f"{path}: {config_file.name} declares markov_head_type {declared!r}, whose head "
                    f"needs tensor {missing[0]}, absent from the weights"
                )
        elif present and not set(names) <= set(MARKOV_HEAD_TENSORS[declared]):
            raise CheckpointError(
                f"{path}: the weights hold {present[0]} of a {head_type!r} Markov head but "
                f"{config_file.name} declares markov_head_type {declared!r}; fix one of them"
            )


def load_dspark(path: Path, target_config=None, dtype=torch.float32) -> DSparkDraftModel:
    """Load a DSpark checkpoint (DeepSpec layout); with `target_config`, refuse one that does not fit."""
    config_file, raw, weights = read_checkpoint(path, "a DSpark")
    if ARCHITECTURE not in (raw.get("architectures") or []):
        raise CheckpointError(
            f"{config_file}: architectures is {raw.get('architectures')}; a DSpark checkpoint has "
            f"[{ARCHITECTURE!r}]"
        )
    spec = DSparkSpec.from_config_dict(raw, str(config_file))
    _check_spec(spec, str(config_file))
    spelled = {name for key in DSPARK_FIELDS for section, name in dspark_spellings(key) if section is None}
    config = Qwen3Config(**{k: v for k, v in raw.items() if k not in spelled | {"dspark_config"}})
    check_config_values(config_file, config)  # a NaN rms_norm_eps or rope_theta drafted NaN
    if target_config is not None:
        check_dspark_fits(spec, config, target_config, str(config_file))
    def rename(key: str) -> str:
        return key.removeprefix("_orig_mod.").removeprefix("model.")

    # the Markov head's names first (a head of another type is named as such), then the sizes
    shapes = weight_shapes(weights, rename)
    _check_markov_tensors(spec, set(shapes), path, config_file)
    check_weights_fit(lambda: DSparkDraftModel(config, spec), shapes, path)
    model = DSparkDraftModel(config, spec)
    state = {rename(k): v for k, v in load_weights(weights).items()}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a shape differs from what config.json implies
        detail = str(exc).splitlines()[1].strip() if len(str(exc).splitlines()) > 1 else str(exc)
        raise CheckpointError(f"{path}: weights do not match {config_file}: {detail}") from None
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the DSpark layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    return cast_keeping_rope(model, dtype).eval()
