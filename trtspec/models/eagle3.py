"""EAGLE-3 drafter network (Li et al., arXiv 2503.01840), in the published checkpoint layout.

- Fused features: the target's low/mid/high hidden states `g = fc(concat(l, m, h))`,
  `fc: Linear(3·target_hidden → H, no bias)`; layers `eagle_aux_hidden_state_layer_ids`
  (default `[1, L//2 − 1, L − 4]`, layer i's output is `hidden_states[i + 1]`).
- ONE decoder layer (`midlayer`) over `[input_layernorm(embed(token)) ; hidden_norm(g)]`: q/k/v
  read 2H, the residual is g itself (SafeAILab/EAGLE; `norm_before_residual` makes it the normed
  g, as vLLM and speculators allow). Logits `lm_head(norm(h))` over a draft vocabulary.
- Drafter slot j pairs the feature of position j with the token at j + 1 and predicts the token
  at j + 2; it sits at RoPE position j. Chain step i ≥ 1 feeds back the layer's own (pre-norm)
  output h in place of g, with the token drafted at step i, at position j + i.
- Reduced draft vocabulary: draft id d is target id `d + d2t[d]`; `t2d[t]` is True for target
  ids the draft vocabulary holds.

State-dict names (no `model.` prefix): `embed_tokens`, `fc`, `midlayer.{hidden_norm,
input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}`,
`norm`, `lm_head`, `d2t`, `t2d` — as `LlamaForCausalLMEagle3` in SafeAILab/EAGLE and SpecForge
writes them. Config: a Llama config with `architectures: ["LlamaForCausalLMEagle3"]`,
`num_hidden_layers: 1`, `draft_vocab_size`, optional `target_hidden_size` and
`eagle_config.eagle_aux_hidden_state_layer_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding

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
from trtspec.models.dflash import apply_rope
from trtspec.models.kv_slots import SlotView
from trtspec.models.target import check_config_values

KV = tuple[torch.Tensor, torch.Tensor]  # k, v [b, kv_heads, c, head_dim], RoPE applied to k
ARCHITECTURE = "LlamaForCausalLMEagle3"
_EAGLE_KEYS = ("draft_vocab_size", "target_hidden_size", "eagle_config", "norm_before_residual")


def default_aux_layer_ids(num_target_layers: int) -> list[int]:
    """The published low/mid/high taps when a checkpoint names none (SpecForge, EAGLE)."""
    return [1, num_target_layers // 2 - 1, num_target_layers - 4]


def causal_mask(past_len: int, s: int) -> torch.Tensor:
    """s new positions after `past_len` cached ones see the cache and themselves causally.
    -> boolean [1, 1, s, past_len + s]"""
    return (torch.arange(past_len + s)[None] <= past_len + torch.arange(s)[:, None])[None, None]


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v read [embedding ; feature] (2H); no q/k norm."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        d, h, kvh = config.head_dim, config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.num_heads, self.num_kv_heads = d, h, kvh
        bias, wide = config.attention_bias, 2 * config.hidden_size
        self.q_proj = nn.Linear(wide, h * d, bias=bias)
        self.k_proj = nn.Linear(wide, kvh * d, bias=bias)
        self.v_proj = nn.Linear(wide, kvh * d, bias=bias)
        self.o_proj = nn.Linear(h * d, config.hidden_size, bias=bias)

    def forward(self, x, cos, sin, past: KV | SlotView | None, mask=None) -> tuple[torch.Tensor, KV]:
        """x [b, s, 2H] over cached `past`: (k, v) with mask [b|1, 1, s, c+s] boolean or None (s == 1
        or causal handled by the caller), or a `SlotView` (slot buffers, causal layout). Returns
        (out [b, s, H], this input's (k, v))."""
        b, s, _ = x.shape
        q = apply_rope(self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        if isinstance(past, SlotView):
            out = past.attend(q, k, v)  # [b, h, s, d]
        else:
            keys = k if past is None else torch.cat([past[0], k], dim=2)  # [b, kvh, c+s, d]
            values = v if past is None else torch.cat([past[1], v], dim=2)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1)), (k, v)


class Eagle3DecoderLayer(nn.Module):
    """The `midlayer`: attention over [input_layernorm(embeds) ; hidden_norm(hidden)], then MLP."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool = False):
        super().__init__()
        eps = config.rms_norm_eps
        self.norm_before_residual = norm_before_residual
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.mlp = LlamaMLP(config)

    def forward(self, embeds, hidden, cos, sin, past: KV | SlotView | None,
                mask=None) -> tuple[torch.Tensor, KV]:
        """embeds, hidden [b, s, H] -> (h [b, s, H] pre-norm, this input's (k, v))."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)  # [b, s, 2H]
        attn, kv = self.self_attn(x, cos, sin, past, mask)
        h = residual + attn
        return h + self.mlp(self.post_attention_layernorm(h)), kv


@dataclass(slots=True)
class Eagle3Spec:
    """The EAGLE-3 fields of a checkpoint's config.json."""

    draft_vocab_size: int
    target_hidden_size: int
    aux_layer_ids: list[int] | None  # None: the published default for the target's depth
    norm_before_residual: bool = False

    @classmethod
    def from_config_dict(cls, raw: dict, where: str) -> Eagle3Spec:
        for field in ("hidden_size", "vocab_size"):
            if field not in raw:
                raise CheckpointError(f"{where}: missing field {field!r}")
        if bool_field(raw, "norm_before_fc", where):
            raise CheckpointError(f"{where}: norm_before_fc is true; trtspec's EAGLE-3 supports only false")
        eagle = object_field(raw, "eagle_config", where)  # no object was an AttributeError naming no field
        # the layer ids sit in eagle_config (SpecForge) or at the top level (older checkpoints); null
        # or [] is absent, any other value is checked (false, 0 or "" ran the default layers)
        ids_key = "eagle_aux_hidden_state_layer_ids"
        section, prefix = (eagle, "eagle_config.") if eagle.get(ids_key) not in (None, []) else (raw, "")
        # draft_vocab_size and target_hidden_size default to the draft's own (null taken as absent)
        sizes = {k: v for k, v in raw.items() if v is not None}
        return cls(
            draft_vocab_size=int_field(sizes, "draft_vocab_size", where, "EAGLE-3",
                                       default=int_field(raw, "vocab_size", where, "EAGLE-3")),
            target_hidden_size=int_field(sizes, "target_hidden_size", where, "EAGLE-3",
                                         default=int_field(raw, "hidden_size", where, "EAGLE-3")),
            aux_layer_ids=int_list_field(section, ids_key, where, "EAGLE-3", prefix) if section.get(ids_key)
            not in (None, []) else None,
            norm_before_residual=bool_field(raw, "norm_before_residual", where),
        )

    def resolved_layer_ids(self, num_target_layers: int) -> list[int]:
        return list(self.aux_layer_ids or default_aux_layer_ids(num_target_layers))


class Eagle3DraftModel(nn.Module):
    """`forward` runs the midlayer; `draft_logits` the head; `to_target_*` map the draft vocabulary."""

    def __init__(self, config: LlamaConfig, spec: Eagle3Spec):
        super().__init__()
        self.config, self.spec = config, spec
        hidden, vocab, draft_vocab = config.hidden_size, config.vocab_size, spec.draft_vocab_size
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.fc = nn.Linear(3 * spec.target_hidden_size, hidden, bias=False)
        self.midlayer = Eagle3DecoderLayer(config, spec.norm_before_residual)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))  # draft id -> offset
        self.register_buffer("t2d", torch.ones(vocab, dtype=torch.bool) if draft_vocab == vocab
                             else torch.zeros(vocab, dtype=torch.bool))  # target id in draft vocab?
        self.rotary_emb = LlamaRotaryEmbedding(config)

    def fuse(self, taps: torch.Tensor) -> torch.Tensor:
        """g = fc(low ; mid ; high).  taps [b, s, 3·target_hidden] -> [b, s, H]"""
        return self.fc(taps.to(self.fc.weight.dtype))

    def forward(self, input_ids, hidden, positions, past: KV | SlotView | None = None, mask=None):
        """input_ids [b, s] (token j+1 of slot j), hidden [b, s, H] (g, or the fed-back h),
        positions [b, s] -> (h [b, s, H] pre-norm, this input's (k, v))."""
        embeds = self.embed_tokens(input_ids)
        cos, sin = self.rotary_emb(hidden, positions)
        return self.midlayer(embeds, hidden, cos, sin, past, mask)

    def draft_logits(self, h: torch.Tensor) -> torch.Tensor:
        """h [b, s, H] -> [b, s, draft_vocab]"""
        return self.lm_head(self.norm(h))

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[..., draft_vocab] -> [..., vocab], −inf on target ids outside the draft vocabulary."""
        if self.spec.draft_vocab_size == self.config.vocab_size and not self.d2t.any():
            return draft_logits
        full = draft_logits.new_full((*draft_logits.shape[:-1], self.config.vocab_size), float("-inf"))
        ids = self.to_target_ids(torch.arange(self.spec.draft_vocab_size, device=draft_logits.device))
        return full.index_copy(-1, ids, draft_logits)


# -- checkpoint layout ------------------------------------------------------------------------

def eagle3_config_dict(model: Eagle3DraftModel, num_target_layers: int) -> dict:
    raw = model.config.to_dict()
    for key in ("transformers_version", "output_hidden_states", "trtspec_special_tokens", "dtype",
                "layer_types", "max_window_layers", "use_sliding_window", "sliding_window", "return_dict",
                "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type",
                "output_attentions", "_name_or_path"):
        raw.pop(key, None)
    spec = model.spec
    rope = raw.get("rope_parameters") or {}
    if rope.get("rope_type", "default") == "default" and "rope_theta" in rope:
        raw["rope_theta"] = rope["rope_theta"]  # the field transformers 4.x readers (SGLang, EAGLE) expect
    raw.update(
        architectures=[ARCHITECTURE],
        model_type="llama",
        num_hidden_layers=1,
        draft_vocab_size=spec.draft_vocab_size,
        target_hidden_size=spec.target_hidden_size,
        norm_before_residual=spec.norm_before_residual,
        eagle_config={"eagle_aux_hidden_state_layer_ids": spec.resolved_layer_ids(num_target_layers)},
    )
    return raw


def save_eagle3(model: Eagle3DraftModel, out_dir: Path, num_target_layers: int) -> None:
    write_checkpoint(model, eagle3_config_dict(model, num_target_layers), out_dir)


def check_fits_target(spec: Eagle3Spec, config: LlamaConfig, target_config, where: str) -> None:
    """Refuse a drafter that does not fit its target, naming the field and both values."""
    checks = [
        ("target_hidden_size", spec.target_hidden_size, target_config.hidden_size),
        ("vocab_size", config.vocab_size, target_config.vocab_size),
    ]
    for field, mine, theirs in checks:
        if mine != theirs:
            raise CheckpointError(f"{where}: {field} is {mine} but the target has {theirs}")
    num_layers = target_config.num_hidden_layers
    ids = spec.resolved_layer_ids(num_layers)
    bad = [i for i in ids if not 0 <= i < num_layers]
    if len(ids) != 3 or bad:
        raise CheckpointError(
            f"{where}: eagle_config.eagle_aux_hidden_state_layer_ids {ids} must be 3 layers of a "
            f"target with {num_layers} layers (out of range: {bad})"
        )


def _check_structure(spec: Eagle3Spec, config: LlamaConfig, where: str) -> None:
    if config.num_hidden_layers != 1:
        raise CheckpointError(
            f"{where}: num_hidden_layers is {config.num_hidden_layers}; an EAGLE-3 drafter has one midlayer"
        )
    if not 0 < spec.draft_vocab_size <= config.vocab_size:
        raise CheckpointError(
            f"{where}: draft_vocab_size is {spec.draft_vocab_size} but vocab_size is {config.vocab_size}"
        )


def check_vocab_maps(model: Eagle3DraftModel, where: str) -> None:
    """d2t must send the draft vocabulary one-to-one onto the target ids t2d marks."""
    targets = model.to_target_ids(torch.arange(model.spec.draft_vocab_size))
    vocab = model.config.vocab_size
    if targets.min() < 0 or targets.max() >= vocab:
        raise CheckpointError(f"{where}: d2t maps draft ids outside the target vocabulary of {vocab}")
    if len(torch.unique(targets)) != len(targets):
        raise CheckpointError(f"{where}: d2t maps two draft ids to the same target id")
    marked = model.t2d.nonzero().flatten()
    if not torch.equal(marked, torch.sort(targets).values):
        raise CheckpointError(
            f"{where}: t2d marks {len(marked)} target ids that differ from the {len(targets)} d2t maps to"
        )


def load_eagle3(path: Path, target_config=None, target_embed: nn.Embedding | None = None,
                dtype=torch.float32) -> Eagle3DraftModel:
    """Load an EAGLE-3 checkpoint (SafeAILab/SpecForge layout); with `target_config`, refuse one
    that does not fit. A checkpoint without `embed_tokens.weight` borrows `target_embed`."""
    config_file, raw, weights = read_checkpoint(path, "an EAGLE-3")
    if "speculators_config" in raw:
        raise CheckpointError(f"{config_file}: the speculators layout is not supported; use the "
                              "SafeAILab/SpecForge layout (`midlayer.*`)")
    where = str(config_file)
    spec = Eagle3Spec.from_config_dict(raw, where)
    config = LlamaConfig(**{k: v for k, v in raw.items() if k not in _EAGLE_KEYS})
    check_config_values(config_file, config)  # a NaN rms_norm_eps or rope_theta drafted NaN
    _check_structure(spec, config, where)
    if target_config is not None:
        check_fits_target(spec, config, target_config, where)
        if spec.aux_layer_ids is None:
            spec.aux_layer_ids = default_aux_layer_ids(target_config.num_hidden_layers)
    # a checkpoint without embed_tokens borrows the target's: those parameters may be missing
    check_weights_fit(lambda: Eagle3DraftModel(config, spec),
                      weight_shapes(weights, lambda k: k.removeprefix("model.")), path,
                      shared=config.vocab_size * config.hidden_size)
    model = Eagle3DraftModel(config, spec)
    state = {k.removeprefix("model."): v for k, v in load_weights(weights).items()}
    if "embed_tokens.weight" not in state and target_embed is not None:
        state["embed_tokens.weight"] = target_embed.weight.detach()
    shape_errors = [
        f"{k} {tuple(v.shape)} (expected {tuple(model.state_dict()[k].shape)})"
        for k, v in state.items() if k in model.state_dict() and v.shape != model.state_dict()[k].shape
    ]
    if shape_errors:
        raise CheckpointError(f"{path}: weights do not match config.json: {', '.join(shape_errors[:3])}")
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match the EAGLE-3 layout "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    model.t2d = model.t2d.bool()
    check_vocab_maps(model, str(path / "model.safetensors"))
    return cast_keeping_rope(model, dtype).eval()
