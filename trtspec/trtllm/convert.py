"""Drafter checkpoints -> the layout TensorRT-LLM's PyTorch backend loads for that method.

What TensorRT-LLM reads (modeling_dflash.py, modeling_dspark.py, llm_args.py; see fields.py) and
what differs in the checkpoints trtspec meets:

DFlash (trtspec-trained and z-lab drafters share z-lab's layout):
- backbone: TensorRT-LLM does not register `DFlashDraftModel`; it builds the draft layers from
  `model_type` (`qwen3` -> Qwen3ForCausalLM). A config without `model_type` cannot load: refused.
- `dflash_config.mask_token_id`: when absent TensorRT-LLM silently uses `vocab_size`, an id the
  drafter never saw in training: refused rather than degraded.
- `block_size` is read top-level only; trtspec configs may carry it in `dflash_config`: lifted.
- weights: layer names without a `model.` prefix, plus `fc` / `hidden_norm`; `embed_tokens` and
  `lm_head` are the target's. A `model.` prefix is stripped, stray embeddings are dropped.
- dtype: trtspec's embedded drafters are float32; `dtype` casts to what the target serves in.

DSpark (DeepSeek DeepSpec standalone drafters):
- the DSpark knobs are spelled four ways in the wild (`dspark_config.*`, `dflash_config.*`,
  top-level `dspark_*`, plain top-level); TensorRT-LLM accepts all, in that order, and a missed
  key silently falls back (a markov_rank read as 0 drops the Markov head). We resolve them in the
  same order (`models.dspark.dspark_fields`, which refuses spellings that disagree) and write
  every spelling a reader needs, with one value: top-level `dspark_*` (LLM-API validation), the
  plain DeepSpec names (`modeling_dspark_qwen3.py` reads only those: without plain
  `target_layer_ids` it fails an assert, without `markov_rank` it builds a rank-0 head, without
  `mask_token_id` it drafts from `vocab_size`), and mask id / layer ids in `dflash_config` (the
  DFlash-path DSpark drafter subclasses the DFlash one and reads that).
- `markov_rank` must be > 0 and `block_size` present (TensorRT-LLM requires block_size ==
  max_draft_len, so the deployment's draft length is checked against it).
- weights: backbone as DFlash; Markov / confidence head tensors are copied unchanged (their names
  follow DeepSpec, which TensorRT-LLM ports; not renamed because no rename is documented).
- `markov_head_type` gated / rnn (DeepSpec `GatedMarkovHead` / `RNNHead`): TensorRT-LLM reads the
  head type in three places that do not agree on what they accept (fields.py): its LLM-API field
  and the DeepSeek-V4 DSpark read `dspark_markov_head_type` (vanilla, gated, rnn), the standalone
  Qwen3 drafter `modeling_dspark_qwen3.py` reads plain `markov_head_type` (all three), the
  DFlash-path DSpark reader `dflash_config.markov_head_type` (vanilla only: it raises on the others).
  A gated / RNN checkpoint gets the type under all three, so each reader either builds that head
  or refuses the checkpoint at load; under one spelling alone the others would build a vanilla
  head and draw drafts from another law than the one trained (or fail on the extra tensors). Its
  `markov_head.gate_proj.*` / `joint_proj.*` must be present (TensorRT-LLM's `heads.py` port keeps
  DeepSpec's names).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trtspec.errors import CheckpointError
from trtspec.models.checkpoint import int_field, int_list_field
from trtspec.models.dflash import dflash_block_size
from trtspec.models.dspark import DSPARK_FIELDS, dspark_fields
from trtspec.models.markov import MARKOV_HEAD_TENSORS
from trtspec.plan.models import Architecture
from trtspec.trtllm.fields import DSPARK_DRAFT_KEYS

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_SHARED_WITH_TARGET = ("embed_tokens.weight", "lm_head.weight")


def _read(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    config_file = src / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{src}: no config.json, not a drafter checkpoint")
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{src}: no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return json.loads(config_file.read_text(encoding="utf-8")), tensors


def _backbone_weights(
    tensors: dict[str, torch.Tensor], where: Path, notes: list[str]
) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in tensors.items():
        bare = name.removeprefix("model.")
        if bare != name:
            notes.append(f"renamed {name} -> {bare}")
        if bare.endswith(_SHARED_WITH_TARGET):
            notes.append(f"dropped {name}: TensorRT-LLM uses the target's")
            continue
        out[bare] = tensor
    for required in ("fc.weight", "hidden_norm.weight", "norm.weight"):
        if required not in out:
            raise CheckpointError(f"{where}: weight {required!r} missing; not a DFlash-style drafter")
    return out


def _dflash_config(raw: dict, where: Path, notes: list[str]) -> dict:
    config = dict(raw)
    dflash = dict(config.get("dflash_config") or {})
    if "model_type" not in config:
        raise CheckpointError(
            f"{where}: config.json has no model_type; TensorRT-LLM builds the draft layers "
            "from it (e.g. qwen3)"
        )
    if "mask_token_id" not in dflash:
        raise CheckpointError(
            f"{where}: dflash_config.mask_token_id missing; TensorRT-LLM would use vocab_size"
        )
    if not dflash.get("target_layer_ids"):
        raise CheckpointError(f"{where}: dflash_config.target_layer_ids missing")
    # of their types, as the torch flavour loads them ("258" and "135" were copied as they were)
    int_field(dflash, "mask_token_id", str(where), "DFlash", "dflash_config.")
    int_list_field(dflash, "target_layer_ids", str(where), "DFlash", "dflash_config.")
    if "block_size" not in config and "block_size" not in dflash:
        raise CheckpointError(f"{where}: no block_size (top-level or dflash_config)")
    if "block_size" not in config:
        notes.append("lifted dflash_config.block_size to top-level block_size")
    config["block_size"] = dflash_block_size(raw, str(where))
    config["dflash_config"] = dflash
    config.setdefault("architectures", ["DFlashDraftModel"])
    return config


def _dspark_config(raw: dict, where: Path, notes: list[str]) -> dict:
    fields = dspark_fields(raw, str(where))
    values = {key: fields.get(key) for key in DSPARK_DRAFT_KEYS}
    for key in ("target_layer_ids", "mask_token_id", "block_size", "markov_rank"):
        if values[key] is None:
            raise CheckpointError(
                f"{where}: DSpark {key} not found under any spelling "
                f"(dspark_config.{key}, dflash_config.{key}, {DSPARK_DRAFT_KEYS[key]}, {key})"
            )
    if values["markov_rank"] <= 0:  # an integer: dspark_fields checks each field's type
        raise CheckpointError(
            f"{where}: DSpark markov_rank is {values['markov_rank']}; the Markov head needs > 0"
        )
    config = {k: v for k, v in raw.items() if k != "dspark_config"}
    # dspark_config keys trtspec does not resolve (e.g. shift_label, causal) stay where they were
    rest = {k: v for k, v in (raw.get("dspark_config") or {}).items() if k not in DSPARK_FIELDS}
    if rest:
        config["dspark_config"] = rest
    # Plain DeepSpec names for every field found: modeling_dspark_qwen3 reads only these (fields.py).
    config.update({key: fields[key] for key in DSPARK_FIELDS if key in fields})
    for key, top_key in DSPARK_DRAFT_KEYS.items():
        if values[key] is not None:
            config[top_key] = values[key]
    config["dflash_config"] = {
        **(raw.get("dflash_config") or {}),
        "mask_token_id": values["mask_token_id"],
        "target_layer_ids": list(values["target_layer_ids"]),
    }
    config["block_size"] = values["block_size"]
    notes.append("wrote DSpark fields as plain DeepSpec names and top-level dspark_* (mask id and "
                 "layer ids mirrored in dflash_config)")
    head_type = (values["markov_head_type"] or "vanilla").lower()
    if head_type not in MARKOV_HEAD_TENSORS:
        raise CheckpointError(
            f"{where}: DSpark markov_head_type is {head_type!r}; DeepSpec and TensorRT-LLM know "
            f"{', '.join(MARKOV_HEAD_TENSORS)}"
        )
    if values["markov_head_type"] is not None or head_type != "vanilla":
        config[DSPARK_DRAFT_KEYS["markov_head_type"]] = head_type
        config["markov_head_type"] = head_type
    if head_type != "vanilla":
        config["dflash_config"]["markov_head_type"] = head_type
        notes.append(f"wrote markov_head_type {head_type!r} also as plain markov_head_type and "
                     "dflash_config.markov_head_type (every TensorRT-LLM reader of it)")
    if "model_type" not in config:
        raise CheckpointError(f"{where}: config.json has no model_type for the draft backbone")
    return config


def check_fits(config: dict, target: Architecture, where: Path) -> None:
    """Refuse a converted drafter config that does not fit the deployment's target (its
    deployment.model_id): TensorRT-LLM would find it only on the GPU nodes, loading the drafter."""
    at = where / "config.json"
    if config.get("hidden_size") != target.hidden:
        raise CheckpointError(f"{at}: hidden_size is {config.get('hidden_size')!r} but the deployment's "
                              f"target {target.name} has {target.hidden}: a drafter of another model")
    spec = config.get("dflash_config") or {}
    ids, mask = spec.get("target_layer_ids"), spec.get("mask_token_id")
    if not isinstance(ids, list) or not all(isinstance(i, int) and 0 <= i < target.num_layers for i in ids):
        raise CheckpointError(f"{at}: target_layer_ids {ids!r} are not layers of the deployment's target "
                              f"{target.name} (0 to {target.num_layers - 1})")
    if not isinstance(mask, int) or not 0 <= mask < target.vocab:
        raise CheckpointError(f"{at}: mask_token_id {mask!r} is outside the vocabulary of the deployment's "
                              f"target {target.name} ({target.vocab})")


def convert_drafter(
    src: Path, dst: Path, method: str, *, dtype: str | None = None, max_draft_len: int | None = None,
    target: Architecture | None = None,
) -> dict:
    """Write `src` as a TensorRT-LLM `speculative_model` folder `dst`; returns a report of changes.
    `target`: the deployment's target architecture, which the drafter must fit (`check_fits`)."""
    src, dst = Path(src), Path(dst)
    raw, tensors = _read(src)
    notes: list[str] = []
    if method == "dflash":
        config = _dflash_config(raw, src, notes)
    elif method == "dspark":
        config = _dspark_config(raw, src, notes)
        if max_draft_len is not None and max_draft_len != config["block_size"]:
            raise CheckpointError(
                f"{src}: DSpark block_size {config['block_size']} != max_draft_len "
                f"{max_draft_len}; TensorRT-LLM requires them equal"
            )
    else:
        raise CheckpointError(
            f"{src}: no TensorRT-LLM conversion for drafter method {method!r} "
            "(dflash and dspark are converted; EAGLE-3 checkpoints load as published)"
        )
    if target is not None:
        check_fits(config, target, src)
    weights = _backbone_weights(tensors, src, notes)
    if method == "dspark":
        head_type = config.get("markov_head_type", "vanilla")
        missing = [f"markov_head.{n}" for n in MARKOV_HEAD_TENSORS[head_type]
                   if f"markov_head.{n}" not in weights]
        if missing:
            raise CheckpointError(f"{src}: markov_head_type is {head_type!r} but the weights have no "
                                  f"{missing[0]}")
    if dtype is not None:
        torch_dtype = _DTYPES[dtype]
        weights = {k: v.to(torch_dtype) if v.is_floating_point() else v for k, v in weights.items()}
        config["torch_dtype"] = dtype
        notes.append(f"cast floating-point weights to {dtype}")
    dst.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in weights.items()},
        str(dst / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    report = {"source": str(src), "method": method, "tensors": len(weights), "changes": notes}
    (dst / "trtspec_conversion.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report
