"""Build the engine flavour's target and drafter from an export folder and a session backend.

Where the graphs come from: `folder` when given (a `trtspec build --flavour engine` output),
otherwise the export cache (`trtspec.export.bundle.cached_export`: exported on first use under
$TRTSPEC_CACHE_DIR or ~/.cache/trtspec, keyed by the checkpoints' content). `backend` picks
onnxruntime (the .onnx files) or tensorrt (the engines `python -m trtspec.engine.build` added).
"""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig

from trtspec.config import BuildConfig
from trtspec.engine.drafter import EngineDFlashDrafter
from trtspec.engine.session import open_session
from trtspec.engine.target import EngineTarget
from trtspec.errors import ConfigError
from trtspec.export.bundle import cached_export, load_manifest
from trtspec.models.drafter import Drafter, NoDrafter


def graph_path(folder: Path, manifest: dict, name: str, backend: str) -> Path:
    if backend == "onnxruntime":
        return folder / manifest["graphs"][name]["file"]
    engines = manifest.get("engines") or {}
    if name not in engines:
        raise ConfigError(f"{folder}: no {backend} engine for graph {name!r}; on the GPU node run "
                          f"`python -m trtspec.engine.build {folder}`")
    return folder / engines[name]["file"]


def load_engine_models(config: BuildConfig, use_drafter: bool = True, folder: Path | None = None,
                       backend: str = "onnxruntime") -> tuple[EngineTarget, Drafter]:
    """The target and drafter of `config` as engine-flavour adapters over `backend` sessions."""
    use_drafter = use_drafter and config.drafter is not None
    folder = Path(folder) if folder is not None else cached_export(config, use_drafter)
    manifest = load_manifest(folder)
    info = manifest["drafter"] if use_drafter else None
    if use_drafter and info is None:
        raise ConfigError(f"{folder} was exported without a drafter; export it again with the drafter")
    hf_config = AutoConfig.from_pretrained(config.target.resolved_path, local_files_only=True)
    target_session = open_session(graph_path(folder, manifest, "target", backend), backend)
    target = EngineTarget(target_session, hf_config, tuple(manifest["tap_layer_ids"]) if info else ())
    if info is None:
        return target, NoDrafter()
    drafter = EngineDFlashDrafter(
        open_session(graph_path(folder, manifest, "dflash_context", backend), backend),
        open_session(graph_path(folder, manifest, "dflash_block", backend), backend),
        tuple(manifest["tap_layer_ids"]), info["block_size"], info["mask_token_id"], info["num_layers"],
        info["num_draft_tokens"],
    )
    return target, drafter
