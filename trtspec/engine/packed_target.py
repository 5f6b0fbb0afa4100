"""The target p over an exported graph, serving several requests at once (engine flavour).

`PackedTarget`'s slots, mask and rewinds (`trtspec.models.packed_target.PackedSlots`) over the
same target graph `EngineTarget` runs: the packed ragged batch is one row of T tokens whose
`attention_mask` [1, T, S+T] lets each query see only its own request's live slots, causally.
The cache is the graph's present K/V arrays [1, kvh, S, d]; compaction slices them.
"""

from __future__ import annotations

import torch

from trtspec.engine.session import GraphSession
from trtspec.engine.target import TargetGraph
from trtspec.models.packed_target import Chunk, ChunkOutput, PackedSlots


class EnginePackedTarget(PackedSlots):
    def __init__(self, session: GraphSession, config, tap_layer_ids: tuple[int, ...] = (),
                 precision: str = "float32"):
        self.graph = TargetGraph(session, config, tap_layer_ids, precision)
        self.config = config
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self.graph.clear()

    def forward(self, chunks: list[Chunk]) -> list[ChunkOutput]:
        """Feed every chunk after its request's cached tokens in ONE graph run."""
        input_ids, positions, visible = self._pack(chunks)
        logits, hidden = self.graph.run(input_ids.to(torch.int64).numpy()[None],  # [1, T]
                                        positions.numpy()[None], visible.numpy()[None])
        return self._split(chunks, logits[0], None if hidden is None else hidden[0])

    def _keep_slots(self, keep: torch.Tensor) -> None:
        self.graph.keep(keep.numpy())
