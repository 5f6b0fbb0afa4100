"""A checkpoint folder: `config.json` beside weight files, as Hugging Face targets and the DFlash
(z-lab), DSpark (DeepSpec) and EAGLE-3 (SpecForge) drafters publish them (drafters: one or more
`*.safetensors`). What each format's config holds, and how its weights are named, is the format's
own module (`target`, `dflash`, `dspark`, `eagle3`)."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from trtspec.errors import CheckpointError, TrtspecError
from trtspec.files import replaced, write_text

log = logging.getLogger(__name__)


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception's text on one line, without the "SomeError: " prefixes a library nests in it (the
    CLI's error is one `Error:` line)."""
    said, frames, _ = str(exc).partition("Exception raised from ")  # torch's C++ errors go on with frames
    said = said.rstrip() + ('"' if frames and said.count('"') % 2 else "")  # its quote closed after them
    text = re.sub(r"\b[A-Z]\w*Error: ", "", " ".join(said.split())) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextlib.contextmanager
def building(config_file: Path, kind: str):
    """Whatever goes wrong while a checkpoint's config.json becomes a model — a field transformers
    refuses, a value of the wrong type or out of range that a model's constructor trips on, weights
    of other shapes than the config gives — as a CheckpointError naming the file. Checks of its own
    (CheckpointError and the other TrtspecErrors) pass through as they are; the traceback is logged
    (`-v` shows it)."""
    try:
        yield
    except TrtspecError:
        raise
    except (ArithmeticError, AssertionError, AttributeError, LookupError, RuntimeError, TypeError, ValueError,
            StrictDataclassError) as exc:  # torch checks some arguments by assert
        log.info("%s does not build", config_file, exc_info=True)
        reason = f"{type(exc).__name__} {exc.args[0]!r}" if isinstance(exc, KeyError) else one_line(exc)
        raise CheckpointError(f"{config_file}: {kind} does not build from it: {reason}") from None


def read_config(path: Path, kind: str) -> tuple[Path, dict]:
    """(config.json's path, its contents) of a `kind` checkpoint folder, or a CheckpointError
    naming the file."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{config_file} is missing: not {kind} checkpoint directory")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{config_file} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):  # a list was an AttributeError traceback
        raise CheckpointError(f"{config_file} is not a JSON object of config fields")
    return config_file, config


def read_checkpoint(path: Path, kind: str) -> tuple[Path, dict, list[Path]]:
    """(config.json's path, its contents, the *.safetensors files) of a `kind` drafter checkpoint
    folder, or a CheckpointError naming what is missing."""
    config_file, raw = read_config(path, kind)
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise CheckpointError(f"{path} has no *.safetensors weights")
    return config_file, raw, weights


def int_field(section: dict, key: str, where: str, kind: str, prefix: str = "", default: int | None = None,
              ) -> int:
    """section[key], an integer (`default` when absent and given); a CheckpointError naming the
    field (`prefix` + key: where it sits in config.json) when it is missing or not an integer
    (`null`, a string)."""
    if key not in section and default is not None:
        return default
    if key not in section:
        raise CheckpointError(f"{where}: missing {kind} field {prefix + key!r}: is it a {kind} checkpoint?")
    value = section[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: {prefix}{key} must be an integer, got {value!r}")
    return value


def bool_field(section: dict, key: str, where: str, prefix: str = "") -> bool:
    """section[key], true or false (1 or 0 taken too; False when absent); a CheckpointError naming
    the field otherwise: bool() made the string "false" true."""
    value = section.get(key, False)
    if value not in (0, 1):
        raise CheckpointError(f"{where}: {prefix}{key} must be true or false, got {value!r}")
    return bool(value)


def object_field(section: dict, key: str, where: str, what: str = "an object") -> dict:
    """section[key], a nested section of config.json ({} when absent or null); a CheckpointError
    naming it when it is no object ("abc" was read as a section without fields, 2.5 a TypeError)."""
    value = section.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: {key} must be {what}, got {value!r}")
    return value


def int_list_field(section: dict, key: str, where: str, kind: str, prefix: str = "") -> list[int]:
    """section[key], a non-empty list of integers; a CheckpointError naming the field otherwise."""
    if key not in section:
        raise CheckpointError(f"{where}: missing {kind} field {prefix + key!r}: is it a {kind} checkpoint?")
    value = section[key]
    if not isinstance(value, list) or not value or any(isinstance(i, bool) or not isinstance(i, int)
                                                        for i in value):
        raise CheckpointError(f"{where}: {prefix}{key} must be a list of layer indices, got {value!r}")
    return value


def load_weights(weights: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the weight files, by name."""
    state: dict[str, torch.Tensor] = {}
    for file in weights:
        try:
            state.update(load_file(str(file)))
        except SafetensorError as exc:
            raise CheckpointError(unreadable_weights(file, exc)) from None
    return state


def weight_shapes(files: list[Path],
                  rename: Callable[[str], str] = lambda key: key) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape, by its name as the model names it (`rename`: a file's tensor name to
    that): read from the safetensors headers, or from a PyTorch file mapped, not read (no tensor is
    loaded either way). A file cut short, or a PyTorch file that holds no state dict, is named."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        if file.suffix == ".bin":
            shapes |= {rename(key): shape for key, shape in _torch_shapes(file).items()}
            continue
        try:
            with safe_open(str(file), "pt") as header:
                for key in header.keys():  # noqa: SIM118 - a safe_open handle is no mapping
                    shapes[rename(key)] = tuple(header.get_slice(key).get_shape())
        except SafetensorError as exc:
            raise CheckpointError(unreadable_weights(file, exc)) from None
    return shapes


def _torch_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """The shapes of a PyTorch weight file's tensors: a zip (torch.save's format since 1.6) is
    mapped, not read; an older file is read."""
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(file))
    except Exception as exc:  # noqa: BLE001 - whatever torch's readers raise for a file that is not one
        raise CheckpointError(unreadable_weights(file, one_line(exc, 300))) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: holds a {type(state).__name__}, not a state dict (tensor names to "
                              "tensors, as torch.save(model.state_dict()) writes); save the weights again")
    return {key: tuple(value.shape) for key, value in state.items() if isinstance(value, torch.Tensor)}


def check_weights_fit(build: Callable[[], nn.Module], shapes: dict[str, tuple[int, ...]], where: Path,
                      shared: int = 0) -> None:
    """Before `build()` allocates the model config.json describes: the same model built on the meta
    device (no memory) must fit the weight files' tensors (`shapes`, by `weight_shapes`), each
    tensor both have of one shape, and no more parameters than the files hold (`shared`: those the
    model takes from elsewhere, a drafter's target embeddings, which the files may lack). A
    config.json of a model far larger than its weights (a typo'd num_hidden_layers or
    intermediate_size) is an error naming the folder, not an allocation that takes the machine's
    memory."""
    with torch.device("meta"):
        meta = build()
    expected = {key: tuple(t.shape) for key, t in meta.state_dict().items()}
    for key, shape in sorted(shapes.items()):
        if key in expected and expected[key] != shape:
            raise CheckpointError(f"{where}: the weights do not match config.json: {key} is {list(shape)} in "
                                  f"the weights, {list(expected[key])} by config.json")
    described = sum(p.numel() for p in meta.parameters())
    held = sum(math.prod(shape) for shape in shapes.values())
    if described > held + shared:
        raise CheckpointError(f"{where}: config.json describes a model of {described:,} parameters but the "
                              f"weights hold {held:,} (num_hidden_layers, intermediate_size or "
                              f"hidden_size may be wrong)")


SAFETENSORS_INDEX, BIN_INDEX = "model.safetensors.index.json", "pytorch_model.bin.index.json"  # sharded


def check_weight_files(path: Path) -> list[Path]:
    """Before a checkpoint's weights load, the files transformers loads, found in its order:
    `model.safetensors`, else the shards `model.safetensors.index.json` lists, else
    `pytorch_model.bin`, else the shards `pytorch_model.bin.index.json` lists (a Hub repo of both
    formats downloaded without its `.bin` files keeps their index; a stray `consolidated.safetensors`
    is not read). An index must list files that are there, and shards need their index: each
    missing file is named, where it showed as weights too few for config.json, config.json's model
    not building, or transformers' own traceback. -> the files it reads, for `weight_shapes` to
    check against config.json before anything loads (a torn one is named there)."""
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    for index_name in (SAFETENSORS_INDEX, None, BIN_INDEX):
        if index_name is None:  # between the two indexes, transformers takes a single .bin
            if (path / "pytorch_model.bin").is_file():
                return [path / "pytorch_model.bin"]
            continue
        index = path / index_name
        if not index.is_file():
            continue
        files = _indexed_files(index)
        missing = [file for file in files if not (path / file).is_file()]
        if missing:
            raise CheckpointError(f"{path / missing[0]} is missing: {index_name} lists it ({len(missing)} "
                                  f"of its {len(files)} files missing); copy the checkpoint's weight files "
                                  "again")
        return [path / file for file in files]
    shards = sorted(file.name for pattern in ("*.safetensors", "pytorch_model*.bin")
                    for file in path.glob(pattern))
    if shards:
        raise CheckpointError(f"{path}: weight files {', '.join(shards[:4])} but no model.safetensors or "
                              f"pytorch_model.bin, and no {SAFETENSORS_INDEX} or {BIN_INDEX} listing shards "
                              "(what transformers reads); copy the checkpoint's index too")
    return []


def _indexed_files(index: Path) -> list[str]:
    """The weight files a weight index lists (transformers reads its metadata too)."""
    try:
        given = json.loads(index.read_text(encoding="utf-8"))
        files = sorted(set(given["weight_map"].values()))
        if not all(isinstance(file, str) for file in files) or not isinstance(given["metadata"], dict):
            raise TypeError("a file name that is no string, or metadata no object")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        expected = '{"metadata": {...}, "weight_map": {tensor name: weight file name}}'
        raise CheckpointError(f"{index}: not a weight index ({one_line(exc)}); expected {expected}") from None
    return files


def unreadable_weights(where: Path, exc: Exception | str) -> str:
    """The one line for a weight file that is not whole (a copy cut short) or not safetensors."""
    return f"{where}: a weight file cannot be read ({exc}); copy the checkpoint's weight files again"


def cast_keeping_rope(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model.to(dtype)` with RoPE's inverse frequencies left in float32, as transformers leaves a
    target's: rounded to bfloat16 the frequencies are off by up to 0.37 %, so two positions 1,000
    apart would turn by up to 1.2 radians more or less than the drafter was trained with (head dim
    128, RoPE theta 1e4 or 1e6: the second pair)."""
    kept = {name: buf for name, buf in model.named_buffers() if name.endswith("inv_freq")}
    model.to(dtype)
    for name, buf in kept.items():
        owner, _, attr = name.rpartition(".")
        model.get_submodule(owner).register_buffer(attr, buf, persistent=False)
    return model


def write_checkpoint(model: nn.Module, config: dict, out_dir: Path) -> None:
    """config.json and model.safetensors (the rotary buffers left out: loading recomputes them)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "config.json", json.dumps(config, indent=2))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    with replaced(out_dir / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})


def _generation_config(path: Path) -> tuple[Path, dict]:
    """(generation_config.json's path, its contents; {} when there is none)."""
    config_file = path / "generation_config.json"
    if not config_file.is_file():
        return config_file, {}
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except ValueError as exc:  # no JSON, or not UTF-8
        raise CheckpointError(f"{config_file} is not a JSON object: {exc}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{config_file} is not a JSON object")
    return config_file, raw


def read_sampling_defaults(path: Path) -> dict[str, float | int]:
    """The sampling parameters the checkpoint's generation_config.json recommends, those it gives
    (Qwen3's: temperature 0.6, top_p 0.95, top_k 20); a CheckpointError naming the file and field
    for a value a request could not take."""
    config_file, raw = _generation_config(path)
    checks = {"temperature": (lambda t: 0 <= t <= 2, "a number in [0, 2]"),
              "top_p": (lambda p: 0 < p <= 1, "a number in (0, 1]"),
              "top_k": (lambda k: isinstance(k, int) and k >= 0, "an integer >= 0")}
    defaults: dict[str, float | int] = {}
    for name, (valid, what) in checks.items():
        value = raw.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not valid(value):
            raise CheckpointError(f"{config_file}: {name} must be {what}, got {value!r}")
        defaults[name] = value
    return defaults


def read_end_ids(path: Path, vocab_size: int) -> tuple[int, ...]:
    """The ids that end generation by the checkpoint's `generation_config.json` (`eos_token_id`: one
    id or a list, as Qwen3's `[<|im_end|>, <|endoftext|>]` and Llama 3.1's three ends), or by its
    config.json's where it has no generation_config.json (as transformers' generation config is then
    made from the model's config), or () when they have none; a CheckpointError naming the file and
    field when generation_config.json's are not ids of the model (config.json's such are left out)."""
    config_file, raw = _generation_config(path)
    model_config = not config_file.is_file() and (path / "config.json").is_file()
    if model_config:
        config_file, raw = read_config(path, "a Hugging Face")
    ids = raw.get("eos_token_id")
    ids = [] if ids is None else ids if isinstance(ids, list) else [ids]
    kept = [i for i in ids if type(i) is int and 0 <= i < vocab_size]
    if kept != ids:
        if not model_config:
            raise CheckpointError(f"{config_file}: eos_token_id must be a token id or a list of token ids in "
                                  f"[0, {vocab_size}) (the model's vocab_size), got {ids!r}")
        # transformers loads a model config whatever the field holds: ids the model never emits
        log.warning("%s: eos_token_id %r holds what is no token id in [0, %d); left out",
                    config_file, ids, vocab_size)
    return tuple(kept)
