"""Export a build config's graphs into one folder with a `manifest.json`, atomically.

Folder layout (what `trtspec build --flavour engine` writes and the engine flavour loads):
    target.onnx            target with KV cache in/out and the drafter's taps
    dflash_context.onnx    DFlash context projection           (DFlash drafter only)
    dflash_block.onnx      DFlash block forward, plugin nodes   (DFlash drafter only)
    dspark_context.onnx    DSpark context projection (DFlash's) (DSpark drafter only)
    dspark_block.onnx      DSpark backbone: hidden + base logits (DSpark drafter only)
    dspark_heads.onnx      DSpark Markov and confidence heads   (DSpark drafter only)
    verify_greedy.onnx     greedy verification, plugin node
    verify_sampling.onnx   sampling verification, plugin node
    verify_tree_greedy.onnx    greedy verification of draft trees, plugin node
    verify_tree_sampling.onnx  sampling verification of draft trees, plugin node
    manifest.json          config, sha256 of every file, versions, graph inputs/outputs and taps
The folder is written beside its destination and swapped into place (`trtspec.output`), so an
error never leaves a half-written folder. `cached_export` keeps one export per content hash of
the checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import onnx

from trtspec.config import BuildConfig
from trtspec.errors import CheckpointError, ConfigError
from trtspec.export.graph import OPSET, PRECISIONS
from trtspec.export.plugins import PLUGIN_OPS
from trtspec.output import staged_output

MANIFEST = "manifest.json"
EXPORT_FORMAT = 5  # bump when the graphs' interface changes: invalidates cached exports
EXPORTABLE_DRAFTERS = ("dflash", "dspark")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def graph_signature(model: onnx.ModelProto) -> dict:
    """Inputs and outputs with dtype names and shapes (named dims are dynamic axes)."""
    def describe(v):
        dtype = onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
        return {"name": v.name, "dtype": dtype, "shape": _dims(v)}
    return {"inputs": [describe(v) for v in model.graph.input],
            "outputs": [describe(v) for v in model.graph.output]}


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("trtspec", "torch", "transformers", "onnx", "onnxruntime", "tensorrt"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _drafter_graphs(method: str, path: Path, model, num_draft_tokens: int | None,
                    precision: str) -> tuple[dict, dict]:
    """The drafter's graphs and what its engine adapter needs (`info["drafter"]`)."""
    from trtspec.export.dflash import export_dflash_block, export_dflash_context

    if method == "dflash":
        from trtspec.models.dflash import load_dflash

        drafter = load_dflash(path, model.config)
        most = drafter.spec.block_size - 1  # slot 0 holds the anchor
        graphs = {"dflash_context": export_dflash_context(drafter, precision),
                  "dflash_block": export_dflash_block(drafter, model.get_input_embeddings(),
                                                      model.get_output_embeddings(), precision)}
        extra = {}
    else:
        from trtspec.export.dspark import export_dspark_block, export_dspark_heads
        from trtspec.models.dspark import load_dspark
        from trtspec.spec.sts import load_sts

        drafter = load_dspark(path, model.config)
        most = drafter.spec.block_size  # the anchor is the first prediction position
        graphs = {"dspark_context": export_dflash_context(drafter, precision),
                  "dspark_block": export_dspark_block(drafter, precision),
                  "dspark_heads": export_dspark_heads(drafter, precision)}
        sts = load_sts(path, drafter.spec.block_size)
        head = drafter.markov_head
        extra = {"has_confidence": drafter.confidence_head is not None,
                 "sts_temperatures": None if sts is None else sts.tolist(),
                 # the heads graph carries an RNN head's state in and out (markov_state: [b, n, r])
                 "markov_state_size": 0 if head is None else head.state_size}
    k = num_draft_tokens or most
    if k > most:
        raise CheckpointError(f"drafter.num_draft_tokens is {k} but the {method} block size "
                              f"{drafter.spec.block_size} yields at most {most} drafts")
    info = {"method": method, "block_size": drafter.spec.block_size,
            "mask_token_id": drafter.spec.mask_token_id, "num_layers": len(drafter.layers),
            "num_draft_tokens": k, **extra}
    return graphs, {"tap_layer_ids": list(drafter.spec.target_layer_ids), "drafter": info}


def _graphs(config: BuildConfig, use_drafter: bool) -> tuple[dict[str, onnx.ModelProto], dict]:
    """The graphs of `config` (and what the engine adapters need to know about them)."""
    from trtspec.export.target import check_exportable, export_target
    from trtspec.export.verify import (
        export_verify_greedy,
        export_verify_sampling,
        export_verify_tree_greedy,
        export_verify_tree_sampling,
    )
    from trtspec.models.target import check_checkpoint_dir, load_causal_lm

    target_dir = config.target.resolved_path
    check_checkpoint_dir(target_dir)  # a missing checkpoint first: it is the user's first problem
    precision = config.target.dtype
    if precision not in PRECISIONS:
        raise ConfigError(f"target.dtype {precision!r} has no engine export: the graphs exchange K/V and "
                          f"hidden states as numpy arrays, which have no bfloat16; use "
                          f"{' or '.join(PRECISIONS)}")
    hf_config_file = target_dir / "config.json"
    if hf_config_file.is_file():
        from transformers import AutoConfig

        check_exportable(AutoConfig.from_pretrained(target_dir, local_files_only=True), str(hf_config_file))
    model = load_causal_lm(target_dir, "float32")
    drafter = config.drafter if use_drafter else None
    graphs: dict[str, onnx.ModelProto] = {}
    info: dict = {"vocab_size": model.config.vocab_size, "num_layers": model.config.num_hidden_layers,
                  "precision": precision, "drafter": None, "tap_layer_ids": []}
    if drafter is not None:
        if drafter.method not in EXPORTABLE_DRAFTERS:
            raise ConfigError(f"drafter.method {drafter.method!r} has no engine export yet; the engine "
                              f"flavour exports: {', '.join(EXPORTABLE_DRAFTERS)} (without a drafter: "
                              f"`generate --drafter none`, or a build config with no `drafter:`)")
        drafter_graphs, drafter_info = _drafter_graphs(drafter.method, drafter.resolved_path, model,
                                                       drafter.num_draft_tokens, precision)
        graphs.update(drafter_graphs)
        info.update(drafter_info)
    graphs["target"] = export_target(model, tuple(info["tap_layer_ids"]), precision)
    graphs["verify_greedy"] = export_verify_greedy(model.config.vocab_size)
    graphs["verify_sampling"] = export_verify_sampling(model.config.vocab_size)
    graphs["verify_tree_greedy"] = export_verify_tree_greedy(model.config.vocab_size)
    graphs["verify_tree_sampling"] = export_verify_tree_sampling(model.config.vocab_size)
    return graphs, info


def _write(config: BuildConfig, folder: Path, use_drafter: bool) -> dict:
    graphs, info = _graphs(config, use_drafter)
    entries = {}
    for name, model in graphs.items():
        onnx.checker.check_model(model)
        path = folder / f"{name}.onnx"
        # one file up to protobuf's 2 GiB limit; past it the weights go to a side file
        big = model.ByteSize() > 1_800_000_000
        onnx.save_model(model, str(path), save_as_external_data=big, location=f"{name}.onnx.data")
        entries[name] = {"file": path.name, **graph_signature(model)}
    files = {p.name: sha256_file(p) for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {
        "format": EXPORT_FORMAT,
        "flavour": "engine",
        "config": config.model_dump(mode="json"),
        "paths": {"target": str(config.target.resolved_path),
                  "drafter": str(config.drafter.resolved_path) if config.drafter and use_drafter else None},
        "opset": OPSET,
        "plugins": [f"trtspec::{op}" for op in PLUGIN_OPS],
        **info,
        "graphs": entries,
        "files": files,
        "engines": {},
        "versions": versions(),
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return manifest


def export_bundle(config: BuildConfig, out_dir: Path, use_drafter: bool = True,
                  also: Callable[[Path], object] | None = None, label: str = "--out") -> dict:
    """Write the graphs and manifest of `config` to `out_dir`; returns the manifest. `also(staged)`
    adds more files (the Triton repository) before the folder is moved into place."""
    with staged_output(Path(out_dir), label) as staged:
        manifest = _write(config, staged, use_drafter)
        if also is not None:
            also(staged)
    return manifest


def load_manifest(folder: Path, check_hashes: bool = True) -> dict:
    """Read `folder/manifest.json`; with `check_hashes`, refuse files that changed since export."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise ConfigError(f"{path} is missing: not an engine build folder (run `trtspec build CONFIG "
                          "--out DIR --flavour engine`)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("files is no mapping")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"{path} is not an engine build's manifest ({type(exc).__name__}: {exc}); rebuild "
                          "the folder with `trtspec build CONFIG --out DIR --flavour engine`") from None
    if manifest.get("format") != EXPORT_FORMAT:
        raise ConfigError(f"{path}: export format {manifest.get('format')} is not this trtspec's "
                          f"({EXPORT_FORMAT}); rebuild the folder with `trtspec build CONFIG --out DIR "
                          "--flavour engine`")
    if check_hashes:
        for name, digest in files.items():
            file = Path(folder) / name
            if not file.is_file() or sha256_file(file) != digest:
                raise ConfigError(f"{file} is missing or differs from its sha256 in {path}; "
                                  "rebuild the folder")
    return manifest


def content_key(config: BuildConfig, use_drafter: bool, ignore: tuple[str, ...] = ()) -> str:
    """A hash of the config's model sections and their checkpoints' files; `ignore`: section fields
    left out (say `path`: the files are hashed anyway, wherever their folder is)."""
    digest = hashlib.sha256(f"format={EXPORT_FORMAT};drafter={use_drafter}".encode())
    parts = [config.target] + ([config.drafter] if use_drafter and config.drafter else [])
    for part in parts:
        fields = part.model_dump(mode="json", exclude=set(ignore))
        digest.update(json.dumps(fields, sort_keys=True).encode())
        folder = part.resolved_path
        if not folder.is_dir():
            raise CheckpointError(f"checkpoint directory {folder} does not exist")
        for file in sorted(folder.iterdir()):
            if file.suffix in (".json", ".safetensors", ".bin"):
                digest.update(file.name.encode() + sha256_file(file).encode())
    return digest.hexdigest()[:20]


def cache_root() -> Path:
    return Path(os.environ.get("TRTSPEC_CACHE_DIR", Path.home() / ".cache" / "trtspec"))


def cached_export(config: BuildConfig, use_drafter: bool = True) -> Path:
    """The export folder of `config`'s checkpoints under the cache, exported on first use."""
    folder = cache_root() / "engine" / content_key(config, use_drafter)
    if (folder / MANIFEST).is_file():
        return folder
    export_bundle(config, folder, use_drafter, label="export cache folder")
    return folder
