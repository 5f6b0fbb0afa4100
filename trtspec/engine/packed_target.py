"""The target p over an exported graph, serving several requests at once (engine flavour).

`PackedTarget`'s slots, mask and rewinds (`trtspec.models.packed_target.PackedSlots`) over the
same target graph `EngineTarget` runs: the packed ragged batch is one row of T tokens whose
`attention_mask` [1, T, S+T] lets each query see only its own request's live slots, causally.
The cache is the graph's present K/V arrays [1, kvh, S, d]; compaction slices them.
"""

from __future__ import annotations

import numpy as np
import torch

from trtspec.engine.session import GraphSession
from trtspec.models.packed_target import Chunk, ChunkOutput, PackedSlots


class EnginePackedTarget(PackedSlots):
    def __init__(self, session: GraphSession, config, tap_layer_ids: tuple[int, ...] = (),
                 precision: str = "float32"):
        self.session = session
        self.config = config
        self.num_layers = config.num_hidden_layers
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.precision = precision  # of the graph's K/V and taps
        self._empty = np.zeros((1, config.num_key_value_heads, 0, head_dim), dtype=precision)
        if tap_layer_ids and "hidden_taps" not in session.output_names:
            raise ValueError(f"the target graph has no hidden_taps output, yet taps {tap_layer_ids} were "
                             "asked for; export it with the drafter")
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.cache: list[np.ndarray] = [self._empty] * (2 * self.num_layers)  # k0, v0, k1, v1, ...

    def forward(self, chunks: list[Chunk]) -> list[ChunkOutput]:
        """Feed every chunk after its request's cached tokens in ONE graph run."""
        input_ids, positions, visible = self._pack(chunks)
        feeds = {"input_ids": input_ids.to(torch.int64).numpy()[None],  # [1, T]
                 "position_ids": positions.numpy()[None], "attention_mask": visible.numpy()[None]}
        for i in range(self.num_layers):
            feeds[f"past_key_{i}"], feeds[f"past_value_{i}"] = self.cache[2 * i], self.cache[2 * i + 1]
        out = self.session.run(feeds)
        self.cache = [out[f"present_{kind}_{i}"] for i in range(self.num_layers) for kind in ("key", "value")]
        hidden = torch.from_numpy(out["hidden_taps"][0]) if self.tap_layer_ids else None  # [T, D]
        return self._split(chunks, torch.from_numpy(out["logits"][0]), hidden)

    def _keep_slots(self, keep: torch.Tensor) -> None:
        index = keep.numpy()
        self.cache = [np.ascontiguousarray(c[:, :, index]) for c in self.cache]
