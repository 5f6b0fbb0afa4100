"""`trtspec build --flavour engine`: export the graphs, then build TensorRT engines where possible.

On a machine without TensorRT or a GPU the export folder is complete and the engines are left
for the GPU node: `python -m trtspec.engine.build DIR` builds them from the very files whose
hashes the manifest holds, and records them in the manifest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trtspec.config import BuildConfig
from trtspec.engine.trt import Profile, build_engine, tensorrt_available
from trtspec.errors import CheckpointError, TrtspecError
from trtspec.export.bundle import MANIFEST, export_bundle, load_manifest, sha256_file, versions


class EngineLimits(BaseModel):
    """Shape ranges of the engines' optimization profile."""

    model_config = ConfigDict(extra="forbid")

    max_batch: int = Field(8, ge=1, le=256, description="most requests decoded together: the rows of the "
                                                         "drafter and verify graphs (the build config's "
                                                         "limits.max_concurrency)")
    max_seq: int = Field(4096, ge=16, description="largest context of one request (its target K/V, its "
                                                  "DFlash context)")
    opt_seq: int = Field(512, ge=1, description="context length TensorRT tunes for")
    max_k: int = Field(63, ge=1, le=63, description="most drafts one verification takes")

    @model_validator(mode="after")
    def _opt_within_max(self) -> EngineLimits:
        # a block graph's context axis runs to max_seq: TensorRT refuses a profile whose opt exceeds max
        if self.opt_seq > self.max_seq:
            raise ValueError(f"opt_seq ({self.opt_seq}) must be at most max_seq ({self.max_seq}): TensorRT "
                             "tunes for a context the profile holds")
        return self

    @classmethod
    def of_manifest(cls, manifest: dict) -> EngineLimits:
        """The limits of the build config an export folder was made from: its max_concurrency."""
        limits = (manifest.get("config") or {}).get("limits") or {}
        return cls(max_batch=limits.get("max_concurrency", cls.model_fields["max_batch"].default))


def dim_ranges(limits: EngineLimits, block_size: int, graph: str = "") -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) per named dynamic axis of the exported graphs. The target runs every request
    packed into one row, one shared cache (`EngineTarget`), and the context graph every row's new
    taps packed likewise: those axes reach max_batch × max_seq. A block graph (`graph` *_block) reads
    one request's context per row."""
    n, opt = limits.max_seq, limits.opt_seq
    packed = limits.max_batch * n
    ctx = n if graph.endswith("_block") else packed
    step = min(block_size, packed)  # a block's tokens (a profile's opt is at most its max)
    k = min(block_size - 1, limits.max_k)  # a block's drafts
    return {"batch": (1, 1, limits.max_batch), "seq": (1, step, packed), "past": (0, opt, packed),
            "total": (1, min(opt + step, packed), packed), "ctx": (1, opt, ctx),
            "block": (block_size, block_size, block_size),
            "n": (1, 1, max(block_size, 32)),  # DSpark heads: one slot at a time (a tree: its frontier)
            "nodes": (0, block_size - 1, 256), "nodes_plus_1": (1, block_size, 257),  # draft trees
            "k": (0, k, limits.max_k), "k_plus_1": (1, k + 1, limits.max_k + 1)}


def profile_for(graph: dict, ranges: dict[str, tuple[int, int, int]]) -> Profile:
    """The optimization profile of one manifest graph entry: every input, every named axis ranged."""
    profile: Profile = {}
    for inp in graph["inputs"]:
        dims = [ranges[d] if isinstance(d, str) else (d, d, d) for d in inp["shape"]]
        profile[inp["name"]] = tuple(tuple(r[i] for r in dims) for i in range(3))
    return profile


def build_engines(folder: Path, limits: EngineLimits | None = None) -> list[Path]:
    """Build one engine per graph of `folder` and record them (with hashes) in its manifest."""
    manifest = load_manifest(folder)
    limits = limits or EngineLimits.of_manifest(manifest)
    drafter = manifest.get("drafter") or {}  # none: a target-only export
    block, drafts = drafter.get("block_size", 16), drafter.get("num_draft_tokens", 0)
    if drafts > limits.max_k:  # the verify plugins hold at most max_k drafts a row
        raise TrtspecError(f"{folder / MANIFEST}: the export drafts {drafts} tokens a step, but TensorRT "
                           f"engines verify at most {limits.max_k}; export again with "
                           f"drafter.num_draft_tokens <= {limits.max_k}")
    built = []
    for name, graph in manifest["graphs"].items():
        ranges = dim_ranges(limits, block, name)
        engine = build_engine(folder / graph["file"], folder / f"{name}.engine", profile_for(graph, ranges))
        manifest["engines"][name] = {"file": engine.name, "sha256": sha256_file(engine),
                                     "profile": {k: list(v) for k, v in ranges.items()}}
        built.append(engine)
    manifest["versions"] = versions()
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return built


def build_engine_flavour(config: BuildConfig, out_dir: Path) -> tuple[list[Path], str | None]:
    """Export `config` to `out_dir` with a Triton model repository that serves those graphs
    (`out_dir/model_repository`, for `trtspec serve`); build engines if TensorRT and a GPU are here.
    Returns the written files and, when engines were not built, the one line that says why."""
    from trtspec.config import EngineConfig
    from trtspec.triton.repo import write_triton_repo

    for part, name in ((config.target, "target"), (config.drafter, "drafter")):
        if part is not None and not part.resolved_path.is_dir():
            raise CheckpointError(f"{name} checkpoint {part.resolved_path} is not here: flavour engine "
                                  "exports its graphs from the weights, so build where they are "
                                  "(`trtspec inspect` plans without them)")
    engine = (config.engine or EngineConfig()).model_copy(update={"folder": str(Path(out_dir).resolve())})
    served = config.model_copy(update={"engine": engine})
    repo_files: list[Path] = []

    def write_repo(staged: Path) -> None:
        written = write_triton_repo(served, staged, engine_is_build=True)
        repo_files.extend(out_dir / p.relative_to(staged) for p in written)

    export_bundle(config, out_dir, also=write_repo)
    written = sorted(p for p in out_dir.iterdir() if p.is_file() and not p.name.startswith(".")) + repo_files
    if not tensorrt_available():
        return written, (f"engines not built: TensorRT and a CUDA GPU are needed; on the GPU node run "
                         f"`python -m trtspec.engine.build {out_dir}`")
    return written + build_engines(out_dir), None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):  # --help: the usage, not a folder named --help
        print("usage: python -m trtspec.engine.build DIR   (DIR from `trtspec build CONFIG --out DIR "
              "--flavour engine`)", file=sys.stderr)
        return 0 if args in (["--help"], ["-h"]) else 2
    try:
        for path in build_engines(Path(args[0])):
            print(path)
    except (TrtspecError, ValueError, OSError) as exc:  # a build that cannot finish: 1, as the CLI
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
