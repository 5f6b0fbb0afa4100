"""A DSpark drafter converted by `trtspec/trtllm/convert.py`, read the way each TensorRT-LLM reader
of a standalone (Qwen3-style) DSpark checkpoint reads its config.json (trtspec/trtllm/fields.py
cites the files and commits). Each `_read_*` below restates, in our own words, which keys that
reader looks at, where, and what it falls back to when they are absent; the tests check that a
converted checkpoint gives every reader the drafter's own block size, layer ids, Markov rank, head
type and mask token, and the head tensors its weight loading expects."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from trtspec.models.markov import MARKOV_HEAD_TENSORS
from trtspec.trtllm.convert import convert_drafter
from trtspec.trtllm.fields import DSPARK_DRAFT_KEYS

from .test_markov_heads import _deepspec_checkpoint

TINY_DSPARK = Path(__file__).resolve().parents[1] / "trtspec" / "assets" / "tiny-dspark-b15"


class ReaderRefused(Exception):
    """The reader raises at load on the GPU node (an assert or a ValueError there)."""


def _read_qwen3_standalone(cfg: dict) -> dict:
    """`modeling_dspark_qwen3.py` @ 40289c86, `Qwen3DSparkDraftModel.__init__`: plain top-level names
    only. `target_layer_ids` empty or absent fails an assert; `block_size` defaults to 7; the mask id
    is the speculative_config's, else plain `mask_token_id`, else `vocab_size`; `markov_rank`
    defaults to 0 (the vanilla head then asserts rank > 0); `markov_head_type` defaults to
    "vanilla"; the confidence head exists only with `enable_confidence_head`, and the weights are
    then loaded with strict=True (embed_tokens / lm_head skipped)."""
    layer_ids = list(cfg.get("target_layer_ids") or [])
    if not layer_ids:
        raise ReaderRefused("Qwen3 DSpark drafter config must provide target_layer_ids")
    rank = int(cfg.get("markov_rank", 0))
    if rank <= 0:
        raise ReaderRefused(f"VanillaMarkov requires markov_rank > 0, got {rank}")
    return {
        "block_size": int(cfg.get("block_size", 7)),
        "mask_token_id": int(cfg.get("mask_token_id", cfg["vocab_size"])),
        "target_layer_ids": layer_ids,
        "markov_rank": rank,
        "markov_head_type": str(cfg.get("markov_head_type", "vanilla")),
        "confidence_head": bool(cfg.get("enable_confidence_head", False)),
    }


def _dspark_head_switch(cfg: dict, key: str, aliases: tuple[str, ...] = ()):
    """`resolve_dspark_head_config` (modeling_dflash.py, imported by modeling_dspark.py @ 008b54fe):
    `dspark_config.<k>`, then `dflash_config.<k>`, then top-level `dspark_<k>`, then `<k>`."""
    for name in (key, *aliases):
        for value in ((cfg.get("dspark_config") or {}).get(name),
                      (cfg.get("dflash_config") or {}).get(name),
                      cfg.get(f"dspark_{name}"), cfg.get(name)):
            if value is not None:
                return value
    return None


def _read_dflash_path(cfg: dict) -> dict:
    """The DFlash-path standalone drafter, `GQADSparkForCausalLM` (modeling_dspark.py @ 008b54fe,
    `_DSparkHeadMixin._init_dspark_heads`) over `DFlashForCausalLM.__init__` (modeling_dflash.py
    @ 009d8fa4): mask id from `dflash_config.mask_token_id`, else plain `mask_token_id`, else
    `vocab_size`; layer ids from `dflash_config.target_layer_ids` only; top-level `block_size`;
    Markov rank / head type / confidence switch through the four spellings, rank 0 when absent;
    a head type other than vanilla with rank > 0 raises ("only 'vanilla' is supported")."""
    dflash = cfg.get("dflash_config") or {}
    rank = int(_dspark_head_switch(cfg, "markov_rank") or 0)
    head_type = str(_dspark_head_switch(cfg, "markov_head_type") or "vanilla").lower()
    if rank > 0 and head_type != "vanilla":
        raise ReaderRefused(f"markov_head_type={head_type!r}; only 'vanilla' is supported")
    return {
        "block_size": cfg.get("block_size"),
        "mask_token_id": dflash.get("mask_token_id", cfg.get("mask_token_id", cfg["vocab_size"])),
        "target_layer_ids": dflash.get("target_layer_ids"),
        "markov_rank": rank,
        "markov_head_type": head_type,
        "confidence_head": bool(_dspark_head_switch(cfg, "use_confidence_head",
                                                    ("enable_confidence_head",)) or False),
    }


def _read_llm_args(cfg: dict) -> dict:
    """`TorchLlmArgs.validate_speculative_config` (llm_args.py @ 00043967), DSpark branch: each
    field from `dspark_config.<k>`, `dflash_config.<k>`, top-level `dspark_*` (the mask id as
    `dspark_noise_token_id`), plain `<k>`, first found."""
    found = {}
    for key, prefixed in DSPARK_DRAFT_KEYS.items():
        for value in ((cfg.get("dspark_config") or {}).get(key), (cfg.get("dflash_config") or {}).get(key),
                      cfg.get(prefixed), cfg.get(key)):
            if value is not None:
                found[key] = value
                break
    return found


def _convert(src: Path, dst: Path, block_size: int) -> tuple[dict, set[str]]:
    convert_drafter(src, dst, "dspark", dtype="bfloat16", max_draft_len=block_size)
    return json.loads((dst / "config.json").read_text()), set(load_file(str(dst / "model.safetensors")))


def _expected(src: Path) -> dict:
    raw = json.loads((src / "config.json").read_text())
    return {"block_size": raw["block_size"], "mask_token_id": raw["mask_token_id"],
            "target_layer_ids": raw["target_layer_ids"], "markov_rank": raw["markov_rank"],
            "markov_head_type": raw.get("markov_head_type", "vanilla"),
            "confidence_head": raw["enable_confidence_head"]}


def _heads_load(read: dict, tensors: set[str]) -> None:
    """The Markov / confidence tensors are those the reader builds modules for (strict load)."""
    markov = {f"markov_head.{n}" for n in ("markov_w1.weight", "markov_w2.weight",
                                           *MARKOV_HEAD_TENSORS[read["markov_head_type"]])}
    assert {t for t in tensors if t.startswith("markov_head.")} == markov
    confidence = {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    confidence = confidence if read["confidence_head"] else set()
    assert {t for t in tensors if t.startswith("confidence_head.")} == confidence


def _nested(src: Path, dst: Path) -> Path:
    """The tiny drafter with its DSpark fields moved into `dspark_config` (another spelling in the
    wild), so the converter has to write the plain names itself."""
    shutil.copytree(src, dst)
    raw = json.loads((dst / "config.json").read_text())
    keys = ("block_size", "mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type",
            "enable_confidence_head", "confidence_head_with_markov", "num_target_layers", "num_anchors")
    raw["dspark_config"] = {**{k: raw.pop(k) for k in keys}, "shift_label": False}
    (dst / "config.json").write_text(json.dumps(raw))
    return dst


@pytest.mark.parametrize("spelling", ["deepspec", "nested"])
def test_tiny_dspark_converted_loads_in_every_reader(tmp_path, spelling):
    src = TINY_DSPARK if spelling == "deepspec" else _nested(TINY_DSPARK, tmp_path / "nested")
    want = _expected(TINY_DSPARK)
    out, tensors = _convert(src, tmp_path / "out", want["block_size"])
    qwen3 = _read_qwen3_standalone(out)
    assert qwen3 == want
    _heads_load(qwen3, tensors)
    dflash = _read_dflash_path(out)
    assert dflash == want
    _heads_load(dflash, tensors)
    assert _read_llm_args(out) == {k: want[k] for k in DSPARK_DRAFT_KEYS}
    # a switch trtspec does not resolve keeps its place (GQADSparkForCausalLM reads shift_label)
    assert _dspark_head_switch(out, "shift_label") is (False if spelling == "nested" else None)


@pytest.mark.parametrize("head_type", ["gated", "rnn"])
def test_gated_and_rnn_converted_load_in_the_qwen3_reader_and_are_refused_by_the_dflash_path(
        tmp_path, head_type):
    src = tmp_path / "src"
    src.mkdir()
    _deepspec_checkpoint(src, head_type)
    want = {**_expected(src), "markov_head_type": head_type}
    out, tensors = _convert(src, tmp_path / "out", want["block_size"])
    qwen3 = _read_qwen3_standalone(out)
    assert qwen3 == want
    _heads_load(qwen3, tensors)
    with pytest.raises(ReaderRefused, match=f"'{head_type}'; only 'vanilla'"):
        _read_dflash_path(out)
    assert _read_llm_args(out) == {k: want[k] for k in DSPARK_DRAFT_KEYS}
