"""Build the engine flavour's target and drafter from an export folder and a session backend.

Where the graphs come from: `folder` when given (a `trtspec build --flavour engine` output),
otherwise the export cache (`trtspec.export.bundle.cached_export`: exported on first use under
$TRTSPEC_CACHE_DIR or ~/.cache/trtspec, keyed by the checkpoints' content). `backend` picks
onnxruntime (the .onnx files) or tensorrt (the engines `python -m trtspec.engine.build` added).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import AutoConfig

from trtspec.config import BuildConfig
from trtspec.engine.drafter import EngineDFlashDrafter, EngineDSparkDrafter
from trtspec.engine.session import open_session
from trtspec.engine.target import EngineTarget
from trtspec.engine.verify import GraphVerifier
from trtspec.errors import ConfigError
from trtspec.export.bundle import MANIFEST, cached_export, load_manifest
from trtspec.export.graph import PRECISIONS
from trtspec.models.checkpoint import bool_field, int_field, int_list_field
from trtspec.models.drafter import Drafter, NoDrafter


def graph_path(folder: Path, manifest: dict, name: str, backend: str) -> Path:
    if backend == "onnxruntime":
        return folder / manifest["graphs"][name]["file"]
    engines = manifest.get("engines") or {}
    if name not in engines:
        from trtspec.engine.trt import tensorrt_available

        here = "" if tensorrt_available() else (" (TensorRT is not installed here: `engine.backend: "
                                                "onnxruntime` runs the ONNX graphs on this machine)")
        raise ConfigError(f"{folder}: no {backend} engine for graph {name!r}; on the GPU node run "
                          f"`python -m trtspec.engine.build {folder}`{here}")
    return folder / engines[name]["file"]


def check_engine_batch(folder: Path, manifest: dict, max_concurrency: int) -> None:
    """Refuse engines whose optimization profile takes fewer rows than the config decodes together:
    TensorRT would reject the first step that runs more requests than that."""
    for name, engine in (manifest.get("engines") or {}).items():
        rows = (engine.get("profile") or {}).get("batch", [1, 1, 1])[2]
        if rows < max_concurrency:
            raise ConfigError(f"{folder}: the {name} engine takes batches of at most {rows} requests, "
                              f"but limits.max_concurrency is {max_concurrency}; lower it, or rebuild the "
                              f"engines for it (`python -m trtspec.engine.build {folder}` builds for the "
                              "limits.max_concurrency of the config the folder was exported from)")


def checked_drafter(path: Path, manifest: dict) -> dict | None:
    """manifest.json's drafter section (None: exported without one), its fields checked as
    config.json's are: a hand-edited "false" was bool() true, "135" three string layer ids."""
    where, info = str(path), manifest.get("drafter")
    if info is None:
        return None
    if not isinstance(info, dict):
        raise ConfigError(f"{where}: drafter must be an object, got {info!r}")
    if info.get("method") not in ("dflash", "dspark"):
        raise ConfigError(f"{where}: drafter.method must be dflash or dspark, got {info.get('method')!r}")
    kind = "trtspec build"
    for key in ("block_size", "mask_token_id", "num_layers", "num_draft_tokens"):
        int_field(info, key, where, kind, "drafter.")
    int_field(info, "markov_state_size", where, kind, "drafter.", default=0)
    bool_field({"has_confidence": True, **info}, "has_confidence", where, "drafter.")
    int_list_field(manifest, "tap_layer_ids", where, kind)
    sts = info.get("sts_temperatures")
    if sts is not None and not (isinstance(sts, list) and all(
            type(t) in (int, float) and 0 < t < math.inf for t in sts)):
        raise ConfigError(f"{where}: drafter.sts_temperatures must be a list of numbers > 0, got {sts!r}")
    return info


def load_engine_models(config: BuildConfig, use_drafter: bool = True, folder: Path | None = None,
                       backend: str = "auto") -> tuple[EngineTarget, Drafter, GraphVerifier]:
    """The target, drafter and verifier of `config` as engine-flavour adapters over `backend` sessions
    (auto: TensorRT when the folder has engines and TensorRT is installed, else onnxruntime)."""
    use_drafter = use_drafter and config.drafter is not None
    folder = Path(folder) if folder is not None else cached_export(config, use_drafter)
    manifest = load_manifest(folder)
    if backend == "auto":
        from trtspec.engine.trt import tensorrt_available

        backend = "tensorrt" if manifest.get("engines") and tensorrt_available() else "onnxruntime"
    if backend == "tensorrt":
        check_engine_batch(folder, manifest, config.limits.max_concurrency)
    info = checked_drafter(folder / MANIFEST, manifest) if use_drafter else None
    if use_drafter and info is None:
        raise ConfigError(f"{folder} was exported without a drafter; export it again with the drafter")

    def session(name: str):
        return open_session(graph_path(folder, manifest, name, backend), backend)

    if manifest.get("precision") not in list(PRECISIONS):  # was a TypeError from numpy
        raise ConfigError(f"{folder / MANIFEST}: precision must be one of {', '.join(PRECISIONS)}, got "
                          f"{manifest.get('precision')!r}")
    hf_config = AutoConfig.from_pretrained(config.target.resolved_path, local_files_only=True)
    target = EngineTarget(session("target"), hf_config, tuple(manifest["tap_layer_ids"]) if info else (),
                          manifest["precision"])
    verifier = GraphVerifier(session("verify_greedy"), session("verify_sampling"),
                             session("verify_tree_greedy"), session("verify_tree_sampling"))
    if info is None:
        return target, NoDrafter(), verifier
    method, taps = info["method"], tuple(manifest["tap_layer_ids"])
    shape = (info["block_size"], info["mask_token_id"], info["num_layers"], info["num_draft_tokens"])
    if method == "dflash":
        drafter = EngineDFlashDrafter(session("dflash_context"), session("dflash_block"), taps, *shape)
    else:
        sts = info.get("sts_temperatures")
        drafter = EngineDSparkDrafter(session("dspark_context"), session("dspark_block"),
                                      session("dspark_heads"), taps, *shape,
                                      None if sts is None else torch.tensor(sts),
                                      bool(info.get("has_confidence", True)),
                                      int(info.get("markov_state_size", 0)))
    return target, drafter, verifier
