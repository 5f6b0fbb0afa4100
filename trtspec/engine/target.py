"""The target p over an exported graph session: `TargetModel`'s interface, cache as arrays.

The session's graph takes the cache as `past_*` inputs and returns `present_*`; this adapter
keeps the present tensors between calls and rewinds by slicing them, so `SpeculativeDecoder`
drives it exactly as it drives the torch `TargetModel`.
"""

from __future__ import annotations

import numpy as np
import torch

from trtspec.engine.session import GraphSession
from trtspec.models.target import TargetOutput


class TargetGraph:
    """The exported target graph and its K/V between runs: `past_*` in, `present_*` out, kept as
    arrays [1, kvh, S, d] in the graph's precision and sliced to drop slots."""

    def __init__(self, session: GraphSession, config, tap_layer_ids: tuple[int, ...] = (),
                 precision: str = "float32"):
        self.session = session
        self.num_layers = config.num_hidden_layers
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.precision = precision  # of the graph's K/V and taps
        self._empty = np.zeros((1, config.num_key_value_heads, 0, head_dim), dtype=precision)
        if tap_layer_ids and "hidden_taps" not in session.output_names:
            raise ValueError(f"the target graph has no hidden_taps output, yet taps {tap_layer_ids} were "
                             "asked for; export it with the drafter")
        self.has_taps = bool(tap_layer_ids)
        self.clear()

    def clear(self) -> None:
        self.cache: list[np.ndarray] = [self._empty] * (2 * self.num_layers)  # k0, v0, k1, v1, ...

    def run(self, input_ids: np.ndarray, positions: np.ndarray,
            mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """input_ids, positions [1, s] int64; mask [1, s, S+s] bool (True = attend) -> logits
        [1, s, V] float32 and taps [1, s, n·H] (None without taps); the cache grows by s slots."""
        feeds = {"input_ids": input_ids, "position_ids": positions, "attention_mask": mask}
        for i in range(self.num_layers):
            feeds[f"past_key_{i}"], feeds[f"past_value_{i}"] = self.cache[2 * i], self.cache[2 * i + 1]
        out = self.session.run(feeds)
        self.cache = [out[f"present_{kind}_{i}"] for i in range(self.num_layers) for kind in ("key", "value")]
        hidden = torch.from_numpy(out["hidden_taps"]) if self.has_taps else None
        return torch.from_numpy(out["logits"]), hidden

    def keep(self, slots: slice | np.ndarray) -> None:
        """Keep only the cache slots `slots`: a prefix slice (a view, no copy) or ascending indices."""
        self.cache = [c[:, :, slots] for c in self.cache]


class EngineTarget:
    """Feed tokens, get logits + taps; the cache grows; rewind drops slots."""

    def __init__(self, session: GraphSession, config, tap_layer_ids: tuple[int, ...] = (),
                 precision: str = "float32"):
        self.graph = TargetGraph(session, config, tap_layer_ids, precision)
        self.config = config  # the checkpoint's HF config (the drafter checks it fits)
        self.tap_layer_ids = tuple(tap_layer_ids)
        self.reset()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def seq_len(self) -> int:
        """Tokens held in the KV cache."""
        return self._len

    def reset(self) -> None:
        self.graph.clear()
        self._len = 0
        self.num_forwards = 0

    def forward(self, input_ids: torch.Tensor, last_only: bool = False) -> TargetOutput:
        """Feed `input_ids` [1, s] after the cached tokens; return their logits and taps."""
        s = input_ids.shape[1]
        positions = np.arange(self._len, self._len + s, dtype=np.int64)  # [s]
        causal = np.arange(self._len + s)[None, :] <= positions[:, None]  # [s, past+s]
        logits, hidden = self.graph.run(input_ids.to(torch.int64).numpy(), positions[None], causal[None])
        self._len += s
        self.num_forwards += 1
        return TargetOutput(logits=logits[:, -1:] if last_only else logits, hidden=hidden)

    def rewind(self, num_rejected: int) -> None:
        """Drop the last `num_rejected` cached slots (the rejected draft positions)."""
        if num_rejected < 0:
            raise ValueError(f"rewind takes a non-negative count of slots, got {num_rejected}")
        if num_rejected > self._len:
            raise ValueError(f"cannot rewind {num_rejected} slots from a cache of {self._len}")
        if num_rejected:
            self._len -= num_rejected
            self.graph.keep(slice(0, self._len))
