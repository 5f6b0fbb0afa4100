"""The target model p: a Hugging Face causal LM serving many requests from per-slot K/V buffers.

One `forward` feeds every request's new tokens (a prompt to prefill, or `[last, x_1..x_k]` to
verify) in ONE packed pass and returns the logits asked for and, in the same pass, the hidden
states of the layers a drafter reads (`tap_layer_ids`; layer i's output is `hidden_states[i + 1]`
because index 0 is the embedding output; caught by hooks on those layers alone, `models.taps`).
Each request lives in a slot of preallocated buffers (`trtspec.models.kv_slots`): after
verification the loop calls `rewind(slot, num_rejected)`, a non-negative count of slots that only
shortens the request's length.

A chunk may be a token tree (draft trees, `trtspec.spec.tree`): `parents` gives each token the one
it extends, so a node sees the committed context and its ancestors only, at RoPE position
start + depth. `keep_paths` then keeps the accepted root path, moving its K/V into place (the
path's storage indices are not contiguous); for a chain the path is a prefix and nothing moves.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from trtspec.errors import CheckpointError
from trtspec.models.checkpoint import (
    check_weight_files,
    check_weights_fit,
    one_line,
    read_config,
    unreadable_weights,
    weight_shapes,
)
from trtspec.models.cuda_graphs import MAX_TOKENS, GraphedSteps, StaticLayout
from trtspec.models.kv_slots import (
    Segment,
    SlotKVCache,
    StepLayout,
    TreeSpan,
    hf_forward,
    hf_slot_buffers,
    slot_bytes_per_position,
    use_slot_attention,
)
from trtspec.models.taps import LayerTaps

log = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama", "mistral", "qwen3_moe")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# drafter checkpoints (z-lab, DeepSpec, SafeAILab layouts) whose config.json a causal LM loader would take
DRAFTER_ARCHITECTURES = {"DFlashDraftModel": "DFlash", "Qwen3DSparkModel": "DSpark",
                         "LlamaForCausalLMEagle3": "EAGLE-3"}


def check_checkpoint_dir(path: Path) -> dict:
    """Refuse a directory that is not a loadable HF checkpoint; return its config.json."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint directory {path} does not exist")
    _, config = read_config(path, "a Hugging Face")
    weights = list(path.glob("*.safetensors")) + list(path.glob("pytorch_model*.bin"))
    if not weights:
        raise CheckpointError(
            f"{path} has no weights (*.safetensors or pytorch_model*.bin); "
            "copy the model's weight files next to its config.json"
        )
    return config


def load_causal_lm(path: Path, dtype: str = "float32", device: str = "cpu") -> PreTrainedModel:
    """Load a causal LM from a local checkpoint directory, never from a hub."""
    config = check_checkpoint_dir(path)
    drafter = [a for a in config.get("architectures") or [] if a in DRAFTER_ARCHITECTURES]
    if drafter:  # transformers would load its layers as a causal LM with a random lm_head
        kind = DRAFTER_ARCHITECTURES[drafter[0]]
        raise CheckpointError(f"{path / 'config.json'}: architectures {drafter} is a drafter checkpoint "
                              f"({kind}), not a causal LM: give a target model's checkpoint here")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{path / 'config.json'}: model_type {model_type!r} is not supported; "
            f"expected one of {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    check_dtype_field(path / "config.json", config)
    hf_logging.disable_progress_bar()
    try:
        hf_config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, TypeError, StrictDataclassError) as exc:  # a field of the wrong type
        raise CheckpointError(f"{path / 'config.json'}: transformers cannot read it: {one_line(exc, 300)}") \
            from None
    check_config_values(path / "config.json", hf_config)
    shapes = weight_shapes(check_weight_files(path))  # what transformers will read, no tensor loaded
    # before anything is allocated: a config.json far larger than its weights is refused (a quantized
    # checkpoint's tensors are packed in other shapes and names: transformers' loader judges those)
    if getattr(hf_config, "quantization_config", None) is None:
        # built at the dtype it loads in: from_config trips on a config.json's per-module dtypes
        check_weights_fit(lambda: AutoModelForCausalLM.from_config(hf_config, dtype=DTYPES[dtype]), shapes,
                          path)
    try:  # loaded whatever the shapes, then checked: transformers' own refusal says only "see the report"
        model, info = AutoModelForCausalLM.from_pretrained(
            path, config=hf_config, dtype=DTYPES[dtype], local_files_only=True, ignore_mismatched_sizes=True,
            output_loading_info=True)
    except SafetensorError as exc:
        raise CheckpointError(unreadable_weights(path, exc)) from None
    check_loaded(path, info)
    return model.to(device).eval()


def check_dtype_field(config_file: Path, config: dict) -> None:
    """config.json's dtype (`torch_dtype` before transformers 5), which transformers looks up in torch
    as it reads the file: a name torch does not have ("auto" included) is refused naming the field
    (a mapping of module names to dtypes, which transformers takes too, is left to it)."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if isinstance(value, str) and not isinstance(getattr(torch, value, None), torch.dtype):
            raise CheckpointError(f"{config_file}: {key} {value!r} is not a torch dtype; expected a name "
                                  f"such as {', '.join(DTYPES)} (or leave it out)")


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_config_values(config_file: Path, hf_config) -> None:
    """Refuse what transformers reads but a forward (or trtspec's slots) cannot run: a context of no
    positions, more experts per token than a mixture has, a NaN or boolean rms_norm_eps or rope_theta."""
    positions = getattr(hf_config, "max_position_embeddings", None)
    if positions is not None and not (isinstance(positions, int) and positions > 0):
        raise CheckpointError(f"{config_file}: max_position_embeddings must be a positive number of "
                              f"positions, got {positions!r}")
    # transformers takes both as they are: a NaN made every logit NaN, true ran as rope_theta 1
    eps = getattr(hf_config, "rms_norm_eps", None)
    if eps is not None and not (_number(eps) and 0 <= eps < math.inf):
        raise CheckpointError(f"{config_file}: rms_norm_eps must be a finite number >= 0, got {eps!r}")
    rope = getattr(hf_config, "rope_parameters", None)
    theta = rope.get("rope_theta") if isinstance(rope, dict) else None
    if theta is not None and not (_number(theta) and 0 < theta < math.inf):
        raise CheckpointError(f"{config_file}: rope_parameters.rope_theta must be a finite number > 0, got "
                              f"{theta!r}")
    experts = getattr(hf_config, "num_experts", None)
    per_token = getattr(hf_config, "num_experts_per_tok", None)
    if hf_config.model_type == "qwen3_moe" and isinstance(experts, int) and isinstance(per_token, int) \
            and not 1 <= per_token <= experts:
        raise CheckpointError(f"{config_file}: num_experts_per_tok {per_token} must be in [1, num_experts "
                              f"{experts}]: each token is routed to that many of the layer's experts")


def check_loaded(path: Path, info: dict) -> None:
    """Refuse a checkpoint whose weights do not fill the model its config.json describes: a weight
    of another shape, or one missing (transformers would start it at random and only log it)."""
    if info["mismatched_keys"]:
        mismatched = sorted(info["mismatched_keys"])
        key, weights, model = mismatched[0]
        raise CheckpointError(f"{path}: the weights do not match config.json: {key} is {list(weights)} in "
                              f"the weights, {list(model)} by config.json ({len(mismatched)} such)")
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise CheckpointError(f"{path}: the weights lack {len(missing)} tensors config.json's model has, as "
                              f"{', '.join(missing[:3])} (num_hidden_layers or the layout may be wrong)")


@dataclass(slots=True)
class Chunk:
    slot: int  # the request's slot
    input_ids: torch.Tensor  # [s] tokens to feed after the slot's cached ones
    # a tree: the parent of each node of the tree (−1 = a root, which sees the context only), the
    # nodes stored from `tree_start` (default: this chunk's start), this chunk its last s nodes
    parents: tuple[int, ...] | None = None
    tree_start: int | None = None


def chunk_segment(chunk: Chunk, start: int) -> Segment:
    """The layout segment of `chunk` fed at storage index `start` of its slot."""
    n = len(chunk.input_ids)
    if chunk.parents is None:
        return Segment(chunk.slot, start, n)
    tree_start = start if chunk.tree_start is None else chunk.tree_start
    if tree_start + len(chunk.parents) != start + n:
        raise ValueError(f"slot {chunk.slot}: a tree of {len(chunk.parents)} nodes from {tree_start} does "
                         f"not end with this chunk of {n} tokens at {start}")
    return Segment(chunk.slot, start, n, TreeSpan(tree_start, tuple(chunk.parents)))


@dataclass(slots=True)
class PathKeep:
    """Keep the nodes `path` (offsets from `start`, ascending; for a target tree path[0] = 0, the root)
    of the tree fed at `start` of `slot`: path[j] moves to start + j and the slot then holds
    start + len(path) positions."""

    slot: int
    start: int
    path: list[int]


@dataclass(slots=True)
class TargetOutput:
    logits: torch.Tensor  # [n, V] float32 at the packed positions asked for
    hidden: torch.Tensor | None  # [T, n_taps * H] taps of every packed token, None without taps


STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # inv_freq fixed at load time


def rope_type_of(config) -> str:
    """The model's RoPE variant (transformers' rope_parameters, or the older rope_scaling)."""
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return rope.get("rope_type", rope.get("type", "default"))


# the model types whose attention reads config.sliding_window (Llama's ignores one a config carries)
WINDOWED_MODEL_TYPES = ("mistral", "qwen2", "qwen3", "qwen3_moe")


def sliding_window_of(config) -> int | None:
    """The window of a model's sliding-window layers (transformers' configs set `sliding_window`
    to None when none slides; Qwen2/Qwen3 name each layer's kind in `layer_types`), else None."""
    if getattr(config, "model_type", None) not in WINDOWED_MODEL_TYPES:
        return None
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        return None
    return window or None


def chunk_offsets(chunks: list[Chunk]) -> list[int]:
    """Packed index of each chunk's first token, then the total."""
    offsets = [0]
    for c in chunks:
        offsets.append(offsets[-1] + len(c.input_ids))
    return offsets


class TargetModel:
    """The target over per-slot K/V buffers: `allocate`, then `forward` packed chunks, `rewind`."""

    def __init__(self, model: PreTrainedModel, tap_layer_ids: tuple[int, ...] = (),
                 cuda_graphs: bool = False):
        """`cuda_graphs`: run decode steps padded to static shapes (`trtspec.models.cuda_graphs`),
        replayed as CUDA graphs on a CUDA device and eagerly elsewhere."""
        self.model = model
        self.config = model.config
        num_layers = model.config.num_hidden_layers
        for i in tap_layer_ids:
            if not 0 <= i < num_layers:
                raise ValueError(f"tap layer {i} is out of range for a target with {num_layers} layers")
        self.tap_layer_ids = tuple(tap_layer_ids)
        rope_type = rope_type_of(model.config)
        if rope_type not in STATIC_ROPE_TYPES:
            source = getattr(model.config, "_name_or_path", "")
            where = f"{source}/config.json" if source else "the model's config"
            raise CheckpointError(
                f"{where}: rope_parameters.rope_type {rope_type!r} rescales RoPE by each forward's longest "
                f"position, so in a packed forward one request would rotate by another's length; "
                f"supported: {', '.join(STATIC_ROPE_TYPES)}")
        self.taps = LayerTaps.for_model(model, self.tap_layer_ids) if tap_layer_ids else None
        self.sliding_window = sliding_window_of(model.config)  # its layers attend within it
        self.device = model.device
        use_slot_attention(model)
        self.cuda_graphs = cuda_graphs
        self.graphed: GraphedSteps | None = None
        self.cache: SlotKVCache | None = None
        self.capacity = 0
        self.reset()

    @classmethod
    def from_pretrained(cls, path: Path, dtype: str = "float32", tap_layer_ids=(),
                        device: str = "cpu", cuda_graphs: bool = False) -> TargetModel:
        return cls(load_causal_lm(path, dtype, device), tap_layer_ids, cuda_graphs)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def max_positions(self) -> int:
        return int(getattr(self.config, "max_position_embeddings", 0) or 1 << 20)

    @property
    def kv_bytes_per_position(self) -> int:
        """Bytes of the K/V slot buffers per slot position, every layer."""
        return slot_bytes_per_position(self.config, self.model.dtype)

    def allocate(self, num_slots: int, capacity: int) -> None:
        """Buffers for `num_slots` requests of up to `capacity` positions each (forgets all)."""
        scratch = MAX_TOKENS if self.cuda_graphs else 0  # the padded steps' dummy rows write there
        self.cache = SlotKVCache(hf_slot_buffers(self.config, num_slots, capacity + scratch, self.model.dtype,
                                                 self.device))
        self.capacity = capacity
        if self.cuda_graphs:
            self.graphed = GraphedSteps(self._step, self.device, num_slots, capacity,
                                        capture=self.device.type == "cuda")
        self.reset()

    def reset(self) -> None:
        self.lengths: dict[int, int] = {}  # slot -> positions held
        self.num_forwards = 0

    def seq_len(self, slot: int) -> int:
        return self.lengths.get(slot, 0)

    def forward(self, chunks: list[Chunk], logits_at: torch.Tensor | None = None) -> TargetOutput:
        """Feed every chunk after its slot's cached tokens in ONE forward.  logits_at [n]: packed
        indices whose logits to return (None = every token)."""
        if self.cache is None:
            raise RuntimeError("TargetModel.allocate(num_slots, capacity) must run before forward")
        segments = []
        for c in chunks:
            start = self.seq_len(c.slot)
            if start + len(c.input_ids) > self.capacity:
                raise ValueError(f"slot {c.slot} would hold {start + len(c.input_ids)} positions; "
                                 f"its capacity is {self.capacity}")
            segments.append(chunk_segment(c, start))
        input_ids = torch.cat([c.input_ids for c in chunks]).to(self.device)  # [T]
        padded = self.graphed.run(segments, input_ids) if self.graphed is not None else None
        if padded is not None:  # padded to a static shape: out of the graph's buffers by packed index
            (logits, taps), index = padded  # index [T]
            logits = logits[index if logits_at is None else index[logits_at]]
            hidden = None if taps is None else taps[index]  # [T, D]
        else:
            logits, hidden = self._step(StepLayout(segments, self.device), input_ids, logits_at)
        for s in segments:
            self.lengths[s.slot] = s.start + s.length
        self.num_forwards += 1
        return TargetOutput(logits=logits.float(), hidden=hidden)

    def _step(self, layout: StepLayout | StaticLayout, input_ids: torch.Tensor,
              logits_at: torch.Tensor | None = None) -> tuple:
        """The model over the slot buffers as `layout` places the tokens (packed, or padded for a
        graph).  input_ids [T] -> logits [T or len(logits_at), V], taps [T, D] (None without taps)"""
        if self.taps is None:
            return hf_forward(self.model, self.cache, layout, input_ids, logits_at).logits[0], None
        with self.taps.catching() as caught:
            out = hf_forward(self.model, self.cache, layout, input_ids, logits_at)
        return out.logits[0], LayerTaps.concat(caught)[0]

    def rewind(self, slot: int, num_rejected: int) -> None:
        """Drop the last `num_rejected` positions of a slot (its rejected drafts)."""
        length = self.seq_len(slot)
        if not 0 <= num_rejected <= length:
            raise ValueError(f"cannot rewind {num_rejected} positions of slot {slot} holding {length}")
        self.lengths[slot] = length - num_rejected

    def keep_paths(self, keeps: list[PathKeep]) -> None:
        """After a tree forward: keep each slot's accepted root path, all slots in one move per layer."""
        slots, src, dst = [], [], []
        for k in keeps:
            end = k.start + len(k.path)
            ascending = all(a < b for a, b in zip(k.path, k.path[1:], strict=False))
            if not ascending or (k.path and (k.path[0] < 0 or self.seq_len(k.slot) <= k.start + k.path[-1])):
                raise ValueError(f"slot {k.slot} holds {self.seq_len(k.slot)} positions; cannot keep path "
                                 f"{k.path} from {k.start}")
            moved = [(k.start + p, k.start + j) for j, p in enumerate(k.path) if p != j]
            slots += [k.slot] * len(moved)
            src += [m[0] for m in moved]
            dst += [m[1] for m in moved]
            self.lengths[k.slot] = end
        if slots:
            idx = [torch.tensor(x, dtype=torch.long, device=self.device) for x in (slots, src, dst)]
            for layer in self.cache.layers:
                layer.keep(*idx)

    # a released slot's K/V stay in its buffers (`release` drops only its length), where nothing
    # else writes: a new request in it may keep a prefix (`reuse`)
    reuses_prefixes = True

    def reuse(self, slot: int, length: int) -> None:
        """A new request in `slot` keeps the first `length` positions its buffers still hold from
        the slot's previous one (the loop checked that they hold its prompt's first tokens)."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"slot {slot} cannot keep {length} positions; its capacity is {self.capacity}")
        if length:
            self.lengths[slot] = length
        else:
            self.lengths.pop(slot, None)

    def release(self, slot: int) -> None:
        """A finished request: its slot is free."""
        self.lengths.pop(slot, None)
