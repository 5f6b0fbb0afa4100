"""Hidden-state taps: the outputs of the few target layers a drafter reads, caught in the forward.

`output_hidden_states=True` makes transformers keep every layer's output of the step, L + 1
tensors of [T, H], of which a drafter reads two to five: on an 8B target (36 layers, H = 4096,
bf16) an 8k-token prefill holds 2.5 GB of hidden states it never reads, and each layer pays a
hook. `LayerTaps` hooks only the tapped layers, and keeps their outputs only while a forward of
the `TargetModel` that asked for them runs (`catching`): a model shared with a TargetModel that
reads no taps (an auditor over the same weights) pays nothing.

Tap i is what transformers returns as `hidden_states[i + 1]`: layer i's output, except for the
last layer, whose entry is the final-normed state (`tie_last_hidden_states`): that tap hooks the
final norm. The ONNX export writes the same (`trtspec.export.target`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class LayerTaps:
    """Forward hooks on the tapped layers of one model (one object per model and tap set, `for_model`)."""

    def __init__(self, model: nn.Module, layer_ids: tuple[int, ...]):
        decoder = model.get_decoder()
        layers, norm = decoder.layers, decoder.norm
        self.layer_ids = layer_ids
        self._caught: list[torch.Tensor | None] | None = None  # None: no forward is catching
        for j, i in enumerate(layer_ids):
            module = norm if i == len(layers) - 1 else layers[i]
            module.register_forward_hook(self._hook(j))

    @classmethod
    def for_model(cls, model: nn.Module, layer_ids: tuple[int, ...]) -> LayerTaps:
        """The hooks for `layer_ids` on `model`, registered once however many TargetModels wrap it."""
        registry = model.__dict__.setdefault("_trtspec_taps", {})
        if layer_ids not in registry:
            registry[layer_ids] = cls(model, layer_ids)
        return registry[layer_ids]

    def _hook(self, j: int):
        def catch(module, args, output) -> None:
            if self._caught is not None:
                self._caught[j] = output[0] if isinstance(output, tuple) else output
        return catch

    @contextmanager
    def catching(self) -> Iterator[list[torch.Tensor | None]]:
        """Within: each tapped layer's output [B, T, H] lands at its index in the yielded list."""
        self._caught = caught = [None] * len(self.layer_ids)
        try:
            yield caught
        finally:
            self._caught = None

    @staticmethod
    def concat(caught: list[torch.Tensor | None]) -> torch.Tensor:
        """The taps of one forward side by side.  each [B, T, H] -> [B, T, n_taps * H]"""
        if any(t is None for t in caught):
            raise RuntimeError("a tapped layer did not run in the forward")
        return torch.cat(caught, -1)
