"""The `Drafter` interface every proposer implements, and the registry that builds them.

A drafter only proposes: given the committed tokens it returns k draft tokens and their draft
distributions q. It never decides acceptance (that is `spec.verify`). Drafters that read the
target's hidden states (DFlash, DSpark, EAGLE-3) name the layers in `tap_layer_ids` and receive
the taps of every position the target caches through `begin` and `commit`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from trtspec.spec.sampling import SamplingParams

if TYPE_CHECKING:
    from trtspec.config import DrafterConfig
    from trtspec.models.target import TargetModel


@dataclass(slots=True)
class Proposal:
    tokens: torch.Tensor  # [b, k] draft tokens x_1..x_k
    q_probs: torch.Tensor | None  # [b, k, V] processed draft distributions; None when greedy
    confidence: torch.Tensor | None = None  # [b, k] P(slot j accepted | slots < j were); DSpark

    @classmethod
    def empty(cls) -> Proposal:
        return cls(tokens=torch.zeros(1, 0, dtype=torch.long), q_probs=None)

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


class Drafter(ABC):
    """Proposes draft blocks for one sequence at a time."""

    method: ClassVar[str]
    tap_layer_ids: tuple[int, ...] = ()
    num_draft_tokens: int  # k, the most tokens one proposal holds

    @abstractmethod
    def begin(self, prompt: list[int], hidden: torch.Tensor | None) -> None:
        """A new sequence: the target has cached `prompt`; `hidden` [1, t, D] are its taps."""

    @abstractmethod
    def propose(
        self, committed: list[int], k: int, sampling: SamplingParams, generator: torch.Generator
    ) -> Proposal:
        """Draft `k` tokens to follow `committed` (prompt + generated, last token included)."""

    def commit(self, num_accepted: int, hidden: torch.Tensor | None) -> None:
        """The target cached the last token and `num_accepted` drafts; `hidden` [1, a+1, D]."""


class NoDrafter(Drafter):
    """Plain autoregressive decoding through the same loop: every proposal is empty."""

    method = "none"
    num_draft_tokens = 0

    def begin(self, prompt, hidden):
        pass

    def propose(self, committed, k, sampling, generator):
        return Proposal.empty()


DrafterFactory = Callable[["DrafterConfig", "TargetModel"], Drafter]
_REGISTRY: dict[str, DrafterFactory] = {}


def register_drafter(method: str) -> Callable[[DrafterFactory], DrafterFactory]:
    def wrap(factory: DrafterFactory) -> DrafterFactory:
        _REGISTRY[method] = factory
        return factory

    return wrap


def build_drafter(config: DrafterConfig | None, target: TargetModel) -> Drafter:
    """The drafter a config asks for; `None` (or `--drafter none`) gives `NoDrafter`."""
    if config is None:
        return NoDrafter()
    # importing the implementations fills the registry
    import trtspec.models.dflash_drafter  # noqa: F401
    import trtspec.models.draft_model  # noqa: F401
    import trtspec.models.dspark_drafter  # noqa: F401
    import trtspec.models.eagle3_drafter  # noqa: F401

    if config.method not in _REGISTRY:
        raise ValueError(
            f"drafter.method {config.method!r} is not available in this build; "
            f"available: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[config.method](config, target)
