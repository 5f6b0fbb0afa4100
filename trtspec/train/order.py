"""The order a drafter's training goes through its examples: shuffled once per epoch, no replacement.

Reference trainers (SpecForge's and DeepSpec's samplers) shuffle the examples once per epoch and
walk that order, so an epoch sees every example exactly once. `EpochOrder` does the same: steps take
consecutive slices of an endless stream of permutations, a batch that straddles an epoch's end
finishing it and starting the next. Each permutation is drawn from the run's generator when the
stream reaches it, and `state_dict` (epoch, position in it, its order) goes into the resumable
checkpoint, so a resumed run draws exactly the batches the uninterrupted run draws.
"""

from __future__ import annotations

import torch


class EpochOrder:
    """Example ids in a fresh random order each epoch.  examples [N] -> batches of ids."""

    def __init__(self, examples: torch.Tensor, gen: torch.Generator):
        if len(examples) == 0:
            raise ValueError("EpochOrder needs at least one example")
        self.examples = examples  # [N] the ids an epoch goes through
        self.gen = gen
        self.epoch = 0  # epochs finished before the current one
        self.position = 0  # examples of the current epoch already taken
        self.order = self._shuffled()  # [N] the current epoch's order

    def _shuffled(self) -> torch.Tensor:
        return self.examples[torch.randperm(len(self.examples), generator=self.gen)]

    def take(self, n: int) -> torch.Tensor:
        """The next `n` ids of the stream.  -> [n]"""
        parts = []
        while n > 0:
            if self.position == len(self.order):  # the epoch is done: the next one, reshuffled
                self.epoch, self.position, self.order = self.epoch + 1, 0, self._shuffled()
            part = self.order[self.position : self.position + n]
            parts.append(part)
            self.position += len(part)
            n -= len(part)
        return torch.cat(parts) if parts else self.examples[:0]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position, "order": self.order.clone()}

    def load_state_dict(self, state: dict) -> None:
        order = state["order"]
        if sorted(order.tolist()) != sorted(self.examples.tolist()):
            raise ValueError("the saved order is not a permutation of this run's examples")
        self.epoch, self.position, self.order = int(state["epoch"]), int(state["position"]), order

    def skip_to(self, consumed: int) -> None:
        """Stand at example `consumed` of the stream with the current order (a checkpoint written
        before the order was saved: its batches were drawn with replacement and cannot be
        replayed, so the run goes on without replacement from where its count says it is)."""
        self.epoch, self.position = divmod(consumed, len(self.examples))
