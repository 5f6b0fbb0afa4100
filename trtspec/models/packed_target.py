"""The target p serving several requests at once: ONE forward over their ragged inputs.

All requests share one KV cache laid out as a single sequence of slots. Each slot remembers
the request that owns it and the position it holds in that request; a slot freed by a rewind
or a finished request is marked dead (owner −1) and skipped by the mask until `compact` drops
it. A forward packs every request's new tokens into one row (no padding, so its cost follows
the total token count B the scheduler budgets for):

    input   [1, T]      request 0's chunk | request 1's chunk | ...   (T = Σ chunk lengths)
    mask    [1, 1, T, S+T]   query of request r at position i sees the live slots of r at
                             positions ≤ i (its cache and its own chunk, causally)

This is the vLLM/TensorRT-LLM "packed ragged batch" in plain transformers; on a GPU the same
mask is what a paged attention kernel computes without materialising it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel

from trtspec.models.target import cache_argument

DEAD = -1


@dataclass(slots=True)
class Chunk:
    request: int  # request id (any int ≥ 0)
    input_ids: torch.Tensor  # [s] tokens to feed after the request's cached ones


@dataclass(slots=True)
class ChunkOutput:
    logits: torch.Tensor  # [s, V]
    hidden: torch.Tensor | None  # [s, n_taps * H] or None without taps


class PackedSlots:
    """The slot bookkeeping of a packed cache: who owns each slot, at which position, and the
    mask of one packed forward. Subclasses hold the cache and run the model."""

    tap_layer_ids: tuple[int, ...] = ()

    def reset(self) -> None:
        self.owner = torch.empty(0, dtype=torch.long)  # [S] request of each slot, DEAD if freed
        self.position = torch.empty(0, dtype=torch.long)  # [S] position within its request
        self.lengths: dict[int, int] = {}  # live tokens per request
        self.num_forwards = 0

    def seq_len(self, request: int) -> int:
        return self.lengths.get(request, 0)

    @property
    def num_slots(self) -> int:
        return len(self.owner)

    def _pack(self, chunks: list[Chunk]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append the chunks' slots.  -> input_ids [T], position_ids [T], visible [T, S+T] bool"""
        owner_q = torch.cat([torch.full((len(c.input_ids),), c.request) for c in chunks])  # [T]
        pos_q = torch.cat([self.seq_len(c.request) + torch.arange(len(c.input_ids)) for c in chunks])
        owner_k = torch.cat([self.owner, owner_q])  # [S+T]
        pos_k = torch.cat([self.position, pos_q])
        visible = (owner_k[None, :] == owner_q[:, None]) & (pos_k[None, :] <= pos_q[:, None])
        self.owner, self.position = owner_k, pos_k
        for c in chunks:
            self.lengths[c.request] = self.seq_len(c.request) + len(c.input_ids)
        self.num_forwards += 1
        return torch.cat([c.input_ids for c in chunks]), pos_q, visible

    @staticmethod
    def _split(chunks: list[Chunk], logits: torch.Tensor, hidden: torch.Tensor | None) -> list[ChunkOutput]:
        """logits [T, V], hidden [T, D] | None -> one ChunkOutput per chunk."""
        results, start = [], 0
        for c in chunks:
            end = start + len(c.input_ids)
            results.append(ChunkOutput(logits[start:end], None if hidden is None else hidden[start:end]))
            start = end
        return results

    def rewind(self, request: int, num_rejected: int) -> None:
        """Free the last `num_rejected` slots of `request` (its rejected drafts)."""
        length = self.seq_len(request)
        if not 0 <= num_rejected <= length:
            raise ValueError(f"cannot rewind {num_rejected} slots of request {request} holding {length}")
        if num_rejected:
            drop = (self.owner == request) & (self.position >= length - num_rejected)
            self.owner = self.owner.masked_fill(drop, DEAD)
            self.lengths[request] = length - num_rejected

    def release(self, request: int) -> None:
        """A finished request: free all its slots."""
        self.owner = self.owner.masked_fill(self.owner == request, DEAD)
        self.lengths.pop(request, None)

    def compact(self, min_dead_fraction: float = 0.5) -> None:
        """Drop dead slots once they are at least `min_dead_fraction` of the cache."""
        live = self.owner != DEAD
        if self.num_slots == 0 or (~live).float().mean() < min_dead_fraction:
            return
        keep = torch.nonzero(live).flatten()
        self._keep_slots(keep)
        self.owner, self.position = self.owner[keep], self.position[keep]

    def _keep_slots(self, keep: torch.Tensor) -> None:
        """Keep only cache slots `keep` [S'] (ascending)."""
        raise NotImplementedError


class PackedTarget(PackedSlots):
    """Many sequences in one cache; `forward` feeds each a chunk in one pass; `rewind` per request."""

    def __init__(self, model: PreTrainedModel, tap_layer_ids: tuple[int, ...] = ()):
        self.model = model
        self.config = model.config
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.cache = DynamicCache()

    @torch.inference_mode()
    def forward(self, chunks: list[Chunk]) -> list[ChunkOutput]:
        """Feed every chunk after its request's cached tokens in ONE target forward."""
        input_ids, positions, visible = self._pack(chunks)
        dtype = self.model.dtype
        mask = torch.zeros(visible.shape, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
        out = self.model(
            input_ids=input_ids[None],  # [1, T]
            position_ids=positions[None],
            attention_mask=mask[None, None],  # [1, 1, T, S+T]
            **{cache_argument(self.model): self.cache},
            use_cache=True,
            output_hidden_states=bool(self.tap_layer_ids),
        )
        hidden = None
        if self.tap_layer_ids:
            hidden = torch.cat([out.hidden_states[i + 1][0] for i in self.tap_layer_ids], -1)  # [T, D]
        return self._split(chunks, out.logits[0], hidden)

    def _keep_slots(self, keep: torch.Tensor) -> None:
        for layer in self.cache.layers:
            if getattr(layer, "keys", None) is not None and layer.keys.numel():
                layer.keys = layer.keys.index_select(-2, keep)
                layer.values = layer.values.index_select(-2, keep)
