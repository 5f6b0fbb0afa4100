"""`trtspec profile --synthetic MODEL`: the real-size cost curve behind every speedup claim.

Random weights of a real architecture (trtspec/plan/models.py), created directly on the device in
the serving dtype (bfloat16 on a GPU; no checkpoint, no download), then timed:
- the target forward for n new tokens at context c and batch b, eager and as a replayed CUDA
  graph (`static_target.StaticKVTarget`: a static KV cache, as gpt-fast captures its decode step),
  beside its HBM floor (weights + KV + logits bytes over the copy bandwidth);
- the same forward through transformers' own model and DynamicCache, and through the serving
  loop's own target (`TargetModel`: slot K/V, the packed eager forward, and the padded step it
  replays as a CUDA graph with `cuda_graphs`);
- the DFlash draft step (the drafter's block forward over the cached context, the context
  projection of B new positions and the target's LM head over the B - 1 drafts) at B = 4, 8, 16;
- the two plugin kernels at the model's shapes (`plugins.bench`);
- the decode loop's own per-cycle overhead (`loop_overhead`).
`synthetic_report` turns this into projected speedups and Markdown. On the CPU the same code runs a
scaled-down architecture (`scale: small`) so CI exercises every line but the graph capture; there,
each kind of callable the GPU run captures (the static target's forward, the draft step, the
serving target's padded step) runs once as a capture and a replay would under
`models.graph_audit.CaptureAudit`, and `capture_audit` lists what a capture would refuse or replay
stale (nothing, when it is ready for the GPU).
Work runs in priority order under a time budget; what the budget cuts is listed as skipped.
"""

from __future__ import annotations

import dataclasses
import gc
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from trtspec.bench.device_timer import Deadline, DeviceTimer
from trtspec.bench.static_target import StaticKVTarget
from trtspec.bench.synthetic_report import finish
from trtspec.errors import ConfigError
from trtspec.memory import GIB, free_bytes
from trtspec.models.graph_audit import CaptureAudit
from trtspec.plan.gpus import gpu_for_device
from trtspec.plan.models import DRAFTERS, TARGETS, Architecture

log = logging.getLogger(__name__)

# the result's lists of measurements (besides `skipped`: what the budget or a failure cut)
MEASUREMENTS = ("target_forward", "hf_forward", "serving", "draft", "plugins")


@dataclass(frozen=True, slots=True)
class SyntheticModel:
    """A target/drafter pair from trtspec/plan/models.py that the synthetic profile can build."""

    key: str
    target_id: str
    drafter_id: str
    model_type: Literal["qwen3", "llama"]
    block_size: int  # the drafter's B: the target verifies B tokens per cycle


SYNTHETIC_MODELS = {
    m.key: m
    for m in (
        SyntheticModel("qwen3-8b", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", "qwen3", 16),
        # block 10: the DFlash paper's Llama-3.1 block size (trtspec/plan/models.py notes the
        # drafter's layer count is assumed)
        SyntheticModel("llama3.1-8b", "meta-llama/Llama-3.1-8B-Instruct",
                       "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat", "llama", 10),
    )
}


def resolve_model(name: str) -> SyntheticModel:
    """A model by short name (qwen3-8b) or by its target's Hugging Face id (Qwen/Qwen3-8B)."""
    for model in SYNTHETIC_MODELS.values():
        if name.lower() in (model.key, model.target_id.lower()):
            return model
    raise ConfigError(f"no synthetic profile for model {name!r}; known: {', '.join(SYNTHETIC_MODELS)} "
                      "(dense Llama/Qwen3 targets of trtspec/plan/models.py)")


class SyntheticSettings(BaseModel):
    """What `profile_synthetic` measures and how long it may take."""

    model_config = ConfigDict(extra="forbid")

    scale: Literal["full", "small"] = Field(
        "full", description="full: the published architecture; small: the same layout scaled down "
        "(6 target layers, hidden 256) so a CPU runs it in seconds")
    batches: list[int] = Field([1, 2, 4, 8, 16, 32], description="Sequences per target forward.")
    contexts: list[int] = Field([1024, 8192], description="Cached tokens per sequence before the forward.")
    new_tokens: list[int] = Field([1, 2, 4, 8, 16, 32, 64], description="Tokens fed per sequence "
                                  "(1 = decoding, B = verifying a block); the drafter's block size is added.")
    draft_blocks: list[int] = Field([4, 8, 16], description="DFlash block sizes B to time the draft step at.")
    draft_batches: list[int] = Field([1, 8], description="Batch sizes to time the draft step and plugins at.")
    warmup: int = Field(3, ge=0, description="Untimed runs before each measurement.")
    reps: int = Field(10, ge=1, description="Timed runs per measurement (the median is kept).")
    budget_s: float = Field(150.0, gt=0, description="Seconds for one model; work past it is skipped.")
    cuda_graphs: bool = Field(True, description="Also time target forwards and draft steps as CUDA graphs.")
    seed: int = Field(0, description="Seed of the random weights, caches and inputs.")

    @classmethod
    def small(cls, **overrides) -> SyntheticSettings:
        """The CPU/CI shape: scaled-down architecture, short contexts, few repetitions."""
        values = dict(scale="small", batches=[1, 2], contexts=[64, 256], new_tokens=[1, 2, 4, 8, 16],
                      draft_batches=[1, 2], warmup=2, reps=3, budget_s=60.0)
        return cls(**(values | overrides))

    @field_validator("batches", "contexts", "new_tokens", "draft_batches")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if not values or min(values) < 1:
            raise ValueError(f"expected a non-empty list of integers >= 1, got {values}")
        return values

    @field_validator("draft_blocks")
    @classmethod
    def _blocks(cls, values: list[int]) -> list[int]:
        if not values or min(values) < 2:
            raise ValueError(f"DFlash blocks hold at least 2 tokens, got {values}")
        return values


def small_architecture(arch: Architecture, num_layers: int) -> Architecture:
    """`arch`'s layout (GQA ratio 4, SwiGLU 3x) at a size a CPU runs in milliseconds."""
    return dataclasses.replace(arch, name=f"{arch.name} (small: {num_layers} layers, hidden 256)",
                               num_layers=num_layers, hidden=256, heads=8, kv_heads=2, head_dim=32,
                               vocab=2048, intermediate=768,
                               extra_params=0 if arch.has_embeddings else num_layers * 256 * 256)


def _hf_config(arch: Architecture, model_type: str, max_positions: int):
    from transformers import LlamaConfig, Qwen3Config

    fields = dict(vocab_size=arch.vocab, hidden_size=arch.hidden, intermediate_size=arch.intermediate,
                  num_hidden_layers=arch.num_layers, num_attention_heads=arch.heads,
                  num_key_value_heads=arch.kv_heads, head_dim=arch.head_dim,
                  max_position_embeddings=max_positions, tie_word_embeddings=arch.tie_embeddings)
    return (Qwen3Config if model_type == "qwen3" else LlamaConfig)(**fields)


def build_target(arch: Architecture, model_type: str, device: torch.device, dtype: torch.dtype,
                 max_positions: int, seed: int):
    """A causal LM of `arch` with random weights, allocated and initialised on `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(_hf_config(arch, model_type, max_positions), dtype=dtype,
                                                 attn_implementation="sdpa")
    return model.eval()


def build_drafter(arch: Architecture, target: Architecture, block_size: int, device: torch.device,
                  dtype: torch.dtype, max_positions: int):
    """A DFlash drafter of `arch` (z-lab layout, trtspec.models.dflash) with random weights."""
    from trtspec.models.dflash import DFlashDraftModel, DFlashSpec, build_target_layer_ids

    spec = DFlashSpec(block_size=block_size, mask_token_id=target.vocab - 1,
                      target_layer_ids=build_target_layer_ids(target.num_layers, arch.num_layers),
                      num_target_layers=target.num_layers)
    config = _hf_config(arch, "qwen3", max_positions)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are born in `dtype` (no float32 copy on the device)
    try:
        with torch.device(device):
            model = DFlashDraftModel(config, spec)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def kv_bytes_per_token(arch: Architecture, layers: int, element: int) -> int:
    """K and V of one token in `layers` layers of `arch`'s attention shape, `element` bytes each."""
    return 2 * layers * arch.kv_heads * arch.head_dim * element


def _param_bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@dataclass(frozen=True)
class ForwardBytes:
    """The bytes a forward must move (its HBM floor is these over the bandwidth): the weights it
    reads, K/V read and written, embedding rows gathered and logits written. From the models as
    built (any device, `meta` included: no memory)."""

    arch: Architecture  # the target's
    target_weights: int  # without the embedding table (gathered by row), unless the LM head shares it
    lm_head: int
    drafter_weights: int
    drafter_layers: int
    element: int  # bytes per activation / cache element

    @classmethod
    def of(cls, arch: Architecture, target: torch.nn.Module, drafter: torch.nn.Module) -> ForwardBytes:
        embed = target.get_input_embeddings().weight
        table = embed.numel() * embed.element_size()
        tied = target.get_output_embeddings().weight is embed
        return cls(arch, _param_bytes(target) - (0 if tied else table),
                   target.get_output_embeddings().weight.numel() * embed.element_size(),
                   _param_bytes(drafter), len(drafter.layers), embed.element_size())

    def kv_per_token(self, layers: int) -> int:
        return kv_bytes_per_token(self.arch, layers, self.element)

    def target_forward(self, b: int, c: int, n: int) -> int:
        """b sequences, n new tokens each after c cached: weights, embedding rows, KV read +
        written, logits."""
        kv, e = self.kv_per_token(self.arch.num_layers), self.element
        return self.target_weights + b * n * self.arch.hidden * e + b * (c + n) * kv + b * n * kv \
            + b * n * self.arch.vocab * e

    def draft_step(self, b: int, c: int, block: int) -> int:
        """DFlash's step: drafter weights and the target's LM head, its context K/V read and the
        block's written, the block's embeddings, logits of its B - 1 drafts."""
        kv, e = self.kv_per_token(self.drafter_layers), self.element
        return self.drafter_weights + self.lm_head + b * c * kv + b * block * kv \
            + b * block * self.arch.hidden * e + b * (block - 1) * self.arch.vocab * e


def _error(exc: Exception) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class _Profile:
    """One model's measurements; each method adds rows to `self.result`."""

    def __init__(self, model: SyntheticModel, settings: SyntheticSettings, device: torch.device):
        self.model, self.settings, self.device = model, settings, device
        self.cuda = device.type == "cuda"
        self.dtype = torch.bfloat16 if self.cuda else torch.float32
        self.timer = DeviceTimer(device, settings.warmup, settings.reps)
        self.gen = torch.Generator(device=device).manual_seed(settings.seed)
        target, drafter = TARGETS[model.target_id], DRAFTERS[model.drafter_id]
        if settings.scale == "small":
            target, drafter = small_architecture(target, 6), small_architecture(drafter, 2)
        self.arch, self.draft_arch = target, drafter
        self.new_tokens = sorted(set(settings.new_tokens) | {model.block_size})
        self.blocks = sorted(set(settings.draft_blocks) | {model.block_size})
        self.max_len = max(settings.contexts) + max(self.new_tokens + self.blocks)
        self.graphs_skipped = None if self.cuda and settings.cuda_graphs else (
            f"skipped: CUDA graphs need a CUDA device (this run: {device})" if not self.cuda
            else "skipped: cuda_graphs is off")
        self.result: dict = {key: [] for key in (*MEASUREMENTS, "skipped")}
        self.result["capture_audit"] = {}  # on the CPU: kind of captured callable -> problems

    # -- set-up -----------------------------------------------------------------------------
    def need_bytes(self) -> int:
        """A lower bound on what `build` allocates: both models' weights, the static K/V cache at
        the largest batch and the drafter's context K/V (activations come on top)."""
        size = torch.tensor([], dtype=self.dtype).element_size()
        weights = (self.arch.total_params() + self.draft_arch.total_params()) * size
        settings, target_kv = self.settings, kv_bytes_per_token(self.arch, self.arch.num_layers, size)
        draft_kv = kv_bytes_per_token(self.arch, self.draft_arch.num_layers, size)
        return weights + max(settings.batches) * self.max_len * target_kv \
            + max(settings.draft_batches) * max(settings.contexts) * draft_kv

    def check_memory(self) -> None:
        """Refuse, before anything is allocated, a profile the device cannot hold (a full-size
        8B model in float32 on a 23 GiB CPU was killed by the kernel's OOM killer, no word said)."""
        need, free = self.need_bytes(), free_bytes(self.device)
        if free is None or need <= free:
            return
        smaller = "--scale small" if self.settings.scale == "full" else "smaller --batch-sizes or --contexts"
        batch = max(self.settings.batches)
        raise ConfigError(f"{self.model.key} at scale {self.settings.scale} needs at least "
                          f"{need / GIB:.1f} GiB ({self.dtype}: weights, the K/V cache of batch {batch} at "
                          f"{self.max_len:,} positions), but {self.device_name()} has {free / GIB:.1f} GiB "
                          f"free: use {smaller}" + ("" if self.cuda else ", or a GPU (--device cuda)"))

    def build(self) -> None:
        t0 = time.perf_counter()
        self.target = build_target(self.arch, self.model.model_type, self.device, self.dtype,
                                   self.max_len, self.settings.seed)
        self.static = StaticKVTarget(self.target, max(self.settings.batches), self.max_len)
        self.static.fill_random(self.gen)
        self.drafter = build_drafter(self.draft_arch, self.arch, self.model.block_size, self.device,
                                     self.dtype, self.max_len)
        b, c = max(self.settings.draft_batches), max(self.settings.contexts)
        kvh, d = self.arch.kv_heads, self.arch.head_dim
        self.draft_ctx = [tuple(torch.randn(b, kvh, c, d, generator=self.gen, device=self.device,
                                            dtype=self.dtype) for _ in range(2)) for _ in self.drafter.layers]
        self.timer.sync()
        self.result["create_s"] = time.perf_counter() - t0
        self.bytes = ForwardBytes.of(self.arch, self.target, self.drafter)
        self.result["params"] = {"target": sum(p.numel() for p in self.target.parameters()),
                                 "drafter": sum(p.numel() for p in self.drafter.parameters())}

    def bandwidth(self) -> None:
        copy_gbs = self.timer.copy_bandwidth_gbs((1 << 30) if self.cuda else (1 << 26))
        gpu = gpu_for_device(torch.cuda.get_device_name(self.device)) if self.cuda else None
        self.result["bandwidth"] = {
            "copy_gbs": copy_gbs, "floor_gbs": copy_gbs,
            "floor_source": f"device-to-device copy measured in this run on {self.device_name()}",
            "datasheet_gbs": None if gpu is None else gpu.hbm_tb_s * 1e3,
            "table_copy_gbs": None if gpu is None or gpu.copy_tb_s is None else gpu.copy_tb_s * 1e3,
        }
        self.floor_gbs = copy_gbs

    def device_name(self) -> str:
        return torch.cuda.get_device_name(self.device) if self.cuda else "cpu"

    def floor_ms(self, nbytes: int) -> float:
        return nbytes / (self.floor_gbs * 1e9) * 1e3

    def _audit(self, kind: str, fn: Callable[[], object]) -> None:
        """On the CPU, the first callable of each kind run as a CUDA graph's capture and one replay."""
        if self.cuda or kind in self.result["capture_audit"]:
            return
        graph = object()  # what the audit knows this callable's capture by
        with CaptureAudit() as audit:
            outputs = audit.step(kind, graph, None, lambda: (fn(),), [])
            audit.step(kind, graph, outputs, lambda: (fn(),), [])
        self.result["capture_audit"][kind] = audit.problems

    def _timed(self, kind: str, fn: Callable[[], object]) -> tuple[float, float | None, str | None]:
        self._audit(kind, fn)
        eager = self.timer.median_ms(fn)
        if self.graphs_skipped:
            return eager, None, None
        try:
            return eager, self.timer.graph_median_ms(fn), None
        except Exception as exc:  # keep the eager figure; a capture that failed once is not retried
            log.warning("CUDA graph capture failed: %s", _error(exc))
            self.graphs_skipped = f"skipped after a failed capture: {_error(exc)}"
            self.result["cuda_graphs"] = self.graphs_skipped
            return eager, None, _error(exc)

    # -- measurements -----------------------------------------------------------------------
    def target_forward(self, b: int, c: int, n: int) -> None:
        ids = torch.randint(0, self.arch.vocab, (b, n), generator=self.gen, device=self.device)
        positions = (c + torch.arange(n, device=self.device)).expand(b, n).contiguous()
        eager, graph, graph_error = self._timed("target forward",
                                                lambda: self.static.forward(ids, positions, c + n))
        nbytes = self.bytes.target_forward(b, c, n)
        self.result["target_forward"].append(
            {"batch": b, "context": c, "new_tokens": n, "eager_ms": eager, "graph_ms": graph,
             "graph_error": graph_error, "bytes": nbytes, "floor_ms": self.floor_ms(nbytes)})

    def hf_forward(self, c: int, n: int) -> None:
        """transformers' own forward with its DynamicCache, batch 1 (a stock decode, for comparison)."""
        from transformers import DynamicCache

        # transformers 5.17 (the GPU image's) takes `past_key_values`; later 5.x renamed it `cache`
        name = "cache" if "cache" in inspect.signature(self.target.forward).parameters else "past_key_values"
        kwargs = {name: DynamicCache(), "use_cache": True}
        prefix = torch.randint(0, self.arch.vocab, (1, c), generator=self.gen, device=self.device)
        ids = torch.randint(0, self.arch.vocab, (1, n), generator=self.gen, device=self.device)
        self.target(input_ids=prefix, **kwargs)
        ms = self.timer.median_ms(lambda: self.target(input_ids=ids, **kwargs),
                                  between=lambda: kwargs[name].crop(-n))
        self.result["hf_forward"].append({"batch": 1, "context": c, "new_tokens": n, "eager_ms": ms})

    def serving_forward(self, b: int, c: int, n: int) -> None:
        """The serving loop's target (`models.target.TargetModel`) verifying n tokens per request
        for b requests at context c: its packed eager forward, and its padded step (replayed as a
        CUDA graph on CUDA, eager on the CPU). K/V random, as for the static target."""
        from trtspec.models.target import Chunk, TargetModel

        ids = torch.randint(0, self.arch.vocab, (b * n,), generator=self.gen, device=self.device)
        chunks = [Chunk(s, ids[s * n : (s + 1) * n]) for s in range(b)]
        row = {"batch": b, "context": c, "new_tokens": n, "padded": "graph" if self.cuda else "eager"}
        for label, graphs in (("packed_ms", False), ("padded_ms", True)):
            if graphs and self.cuda and not self.settings.cuda_graphs:
                row.update(padded_ms=None, padded="skipped: cuda_graphs is off")
                continue
            target = TargetModel(self.target, cuda_graphs=graphs)
            target.allocate(b, c + n)
            for layer in target.cache.layers:
                layer.keys.normal_(generator=self.gen)
                layer.values.normal_(generator=self.gen)

            def verify(target=target):
                target.lengths = dict.fromkeys(range(b), c)
                return target.forward(chunks)

            if graphs and not self.cuda and "serving padded step" not in self.result["capture_audit"]:
                with CaptureAudit() as audit:  # a capture and a replay of its padded step
                    verify(), verify()
                self.result["capture_audit"]["serving padded step"] = audit.problems
            row[label] = self.timer.median_ms(verify)
            if graphs and target.graphed.failed:
                row["padded"] = f"eager after a failed capture: {target.graphed.failed}"
            del target
        self.result["serving"].append(row)

    def draft_step(self, b: int, c: int, block: int) -> None:
        drafter, head = self.drafter, self.target.get_output_embeddings()
        width = len(drafter.spec.target_layer_ids) * self.arch.hidden
        # target features of up to B newly accepted tokens, projected into the context each cycle
        taps = torch.randn(b, block, width, generator=self.gen, device=self.device, dtype=self.dtype)
        tap_positions = (c - block + torch.arange(block, device=self.device)).expand(b, block).contiguous()
        ids = torch.full((b, block), drafter.spec.mask_token_id, device=self.device)
        ids[:, 0] = 0  # [last verified token, MASK x (B - 1)]
        positions = (c + torch.arange(block, device=self.device)).expand(b, block).contiguous()
        ctx = [(k[:b, :, :c], v[:b, :, :c]) for k, v in self.draft_ctx]
        embed = self.target.get_input_embeddings()

        def layers():
            return drafter(embed(ids), positions, ctx)

        def step():
            drafter.project_context(taps, tap_positions)
            hidden = drafter(embed(ids), positions, ctx)  # [b, B, H]; slot j predicts position c + j
            return head(hidden[:, 1:]).argmax(-1)

        layers_ms = self.timer.median_ms(layers)
        eager, graph, graph_error = self._timed("draft step", step)
        nbytes = self.bytes.draft_step(b, c, block)
        self.result["draft"].append(
            {"batch": b, "context": c, "block": block, "layers_ms": layers_ms, "eager_ms": eager,
             "graph_ms": graph, "graph_error": graph_error, "bytes": nbytes,
             "floor_ms": self.floor_ms(nbytes)})

    def plugins(self) -> None:
        from plugins.bench import bench_kernels

        a, B = self.arch, self.model.block_size
        attention = [(b, a.heads, a.kv_heads, B, c, a.head_dim)
                     for b in self.settings.draft_batches for c in self.settings.contexts]
        verify = [(b, B - 1, a.vocab) for b in self.settings.draft_batches]
        self.result["plugins"] = bench_kernels(self.floor_gbs, (self.dtype,), attention, verify, self.device,
                                               self.timer.median_ms)

    # -- order of work ------------------------------------------------------------------------
    def jobs(self) -> list[tuple[str, Callable[[], None]]]:
        """Everything to measure, most important first (what the budget may cut comes last)."""
        s, first_c = self.settings, self.settings.contexts[0]
        one = [(f"target b1 c{c} n{n}", lambda c=c, n=n: self.target_forward(1, c, n))
               for c in s.contexts for n in self.new_tokens]
        draft1 = [(f"draft b1 c{c} B{B}", lambda c=c, B=B: self.draft_step(1, c, B))
                  for c in s.contexts for B in self.blocks]
        hf = [(f"hf b1 c{first_c} n{n}", lambda n=n: self.hf_forward(first_c, n))
              for n in sorted({1, self.model.block_size})]
        rest = [(f"target b{b} c{c} n{n}", lambda b=b, c=c, n=n: self.target_forward(b, c, n))
                for b in s.batches if b != 1 for c in s.contexts for n in self.new_tokens]
        draft_rest = [(f"draft b{b} c{c} B{B}", lambda b=b, c=c, B=B: self.draft_step(b, c, B))
                      for b in s.draft_batches if b != 1 for c in s.contexts for B in self.blocks]
        serving = [(f"serving b{b} c{first_c} n{n}", lambda b=b, n=n: self.serving_forward(b, first_c, n))
                   for b in sorted({1, max(s.draft_batches)}) for n in sorted({1, self.model.block_size})]
        return one + draft1 + hf + serving + [("plugins", self.plugins)] + rest + draft_rest


def profile_synthetic(model: str, settings: SyntheticSettings, device: torch.device | str,
                      loop_overhead: dict | None = None,
                      on_progress: Callable[[dict], None] | None = None) -> dict:
    """Measure `model`'s cost curve on `device` (see the module docstring); JSON-ready dict.

    `loop_overhead` (from `loop_overhead.measure_loop_overhead`) is measured here when not given.
    `on_progress` gets the result so far (renderable, `partial` set, projections from what is
    measured) once the models are built and after each measurement, so a caller can write it
    out: a run stopped from outside keeps what it measured."""
    import transformers

    from trtspec.bench.loop_overhead import measure_loop_overhead

    spec, device = resolve_model(model), torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda asked for, but no CUDA device is visible")
    deadline = Deadline(settings.budget_s)
    prof = _Profile(spec, settings, device)
    result = prof.result
    result.update(model=spec.key, target=prof.arch.name, drafter=prof.draft_arch.name,
                  block_size=spec.block_size, settings=settings.model_dump(), device=prof.device_name(),
                  dtype=str(prof.dtype).removeprefix("torch."), torch=torch.__version__,
                  transformers=transformers.__version__, cuda_graphs=prof.graphs_skipped or "measured",
                  started=time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    pending = {"per_cycle_ms": 0.0, "cycles": 0, "device": str(device), "model": "-",
               "note": "not measured yet, counted as 0"}

    def progress(left: int) -> None:
        if on_progress is not None:
            result.update(partial=f"{left} measurement(s) not run yet",
                          loop_overhead=loop_overhead or pending,
                          elapsed_s=settings.budget_s - deadline.left())
            on_progress(finish(result))

    prof.check_memory()
    with torch.inference_mode():
        prof.bandwidth()
        prof.build()
        jobs = prof.jobs()
        progress(len(jobs))
        for done, (label, job) in enumerate(jobs, 1):
            if deadline.expired:
                result["skipped"].append(f"{label}: time budget of {settings.budget_s:.0f} s spent")
                continue
            try:
                job()
            except Exception as exc:  # one failed measurement must not lose the others
                log.warning("%s failed: %s", label, _error(exc))
                result["skipped"].append(f"{label}: failed: {_error(exc)}")
            progress(len(jobs) - done)
        del jobs  # each holds the profile (its models and caches), which is freed below
    if loop_overhead is None:
        small = settings.scale == "small"
        try:
            loop_overhead = measure_loop_overhead(device, prompts=1 if small else 2,
                                                  max_tokens=24 if small else 48)
        except Exception as exc:  # the projections then count no overhead, and say so
            log.warning("decode-loop overhead failed: %s", _error(exc))
            loop_overhead = {"per_cycle_ms": 0.0, "cycles": 0, "device": str(device), "model": "-",
                             "note": f"NOT MEASURED, counted as 0 ({_error(exc)})"}
    result["loop_overhead"] = loop_overhead
    result["elapsed_s"] = settings.budget_s - deadline.left()
    result.pop("partial", None)
    finish(result)
    del prof
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result
