"""The `Drafter` interface every proposer implements, and the registry that builds them.

A drafter only proposes: each step it drafts k tokens for EVERY running request in one batched
pass (one forward per block for DFlash/DSpark, one per chain step for EAGLE-3 and draft models)
and returns them with their draft distributions q. It never decides acceptance (`spec.verify`).

Per-request state lives in slots, as the target's K/V does: `allocate(num_slots, capacity)` sizes
the buffers once, `begin(slot, …)` starts a request in a slot, `commit(slot, …)` tells it what the
target kept, `release(slot)` frees it. Prefix reuse: a released slot may keep its state, and
`reusable(slot, prompt)` says how many leading positions of a next prompt the drafter can start
from without their taps (state still valid for them, or none needed); `begin(…, reused=n)` then
gets the taps of the prompt's other positions only. Drafters that read the target's hidden states (DFlash,
DSpark, EAGLE-3) name the layers in `tap_layer_ids` and receive the taps of every position the
target caches through `begin` and `commit`.

`propose_tree` drafts a token tree per request instead of a chain (`trtspec.spec.tree`: EAGLE-2's
dynamic tree; one block forward for DFlash/DSpark, one forward per depth for EAGLE-3 and draft
models, all rows batched). The target keeps the accepted root path; `commit` then receives its
taps exactly as after a chain, so a drafter's committed state is the same either way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch

from trtspec.spec.sampling import SamplingParams

if TYPE_CHECKING:
    from trtspec.config import DrafterConfig, TreeConfig
    from trtspec.models.target import TargetModel
    from trtspec.spec.grammar import GuideState
    from trtspec.spec.tree import DraftTree


@dataclass(slots=True)
class DraftRow:
    """One running request as a drafter sees it in a step."""

    slot: int
    committed: list[int]  # prompt + generated; committed[-1] is the anchor (the last verified token)
    sampling: SamplingParams
    generator: torch.Generator
    grammar: GuideState | None = None  # its guide's matcher: chain drafts (`choose_drafts`) and tree nodes
    # (`grow_tree`) are masked by it

    def position(self, depth: int = 0) -> int:
        """Sequence position of this row's draft at `depth` (0: the first draft, after the anchor)."""
        return len(self.committed) + depth


def draft_positions(rows: list[DraftRow], depth: int = 0, count: int = 1) -> torch.Tensor:
    """Positions of each row's drafts at depths depth..depth+count-1, on the host (they key Gumbel
    coupling's noise, hashed there).  -> [R, count]"""
    first = torch.tensor([row.position(depth) for row in rows])
    return first[:, None] + torch.arange(count)


@dataclass(slots=True)
class Proposal:
    tokens: torch.Tensor  # [R, k] draft tokens x_1..x_k per row
    q_probs: torch.Tensor | None  # [R, k, V] processed draft distributions; None when every row is greedy
    confidence: torch.Tensor | None = None  # [R, k] P(slot j accepted | slots < j were); DSpark

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]


class Drafter(ABC):
    """Proposes draft blocks for a batch of requests held in slots."""

    method: ClassVar[str]
    tap_layer_ids: tuple[int, ...] = ()
    num_draft_tokens: int  # k, the most tokens one proposal holds per request
    num_forwards: int = 0  # drafter network passes so far (one per block, or per chain step)
    cuda_graphs: bool = False  # its decode steps padded to static shapes (`trtspec.models.cuda_graphs`)
    # proposals carry per-slot confidences (DSpark with a confidence head): adaptive speculation then
    # drafts the whole block and lets Algorithm 1 cut each request's verified prefix from this step's
    # confidences
    has_confidence: bool = False

    @property
    def kv_bytes_per_position(self) -> int:
        """Bytes of the K/V slot buffers `allocate` makes per slot position (0: none of its own)."""
        return 0

    def allocate(self, num_slots: int, capacity: int) -> None:
        """Per-slot state for `num_slots` requests of up to `capacity` positions (forgets all).
        The loop calls it on its own copy of the drafter, so buffers made here are that copy's."""

    @abstractmethod
    def begin(self, slot: int, prompt: list[int], hidden: torch.Tensor | None, reused: int = 0) -> None:
        """A new request in `slot`: the target cached `prompt`; `hidden` [t, D] are the taps of its
        positions reused..len(prompt)−1, the first `reused` (at most `reusable`) kept from before."""

    def reusable(self, slot: int, prompt: list[int]) -> int:
        """Leading positions of `prompt` this drafter can start from without their taps (prefix
        reuse): what the state `slot` kept at `release` still holds of them, or positions it needs
        no state for. 0: none."""
        return 0

    def commit(self, slot: int, num_accepted: int, hidden: torch.Tensor | None) -> None:
        """The target cached the request's last token and `num_accepted` drafts; `hidden` [a+1, D]."""

    def release(self, slot: int, tokens: list[int] | None = None) -> None:
        """The request in `slot` finished. `tokens` (its prompt + generated): the slot may keep its
        state of them for a next prompt that starts the same (`reusable`); None: keep nothing."""

    def release_many(self, releases: list[tuple[int, list[int] | None]]) -> None:
        """`release` of every (slot, tokens) of the requests one step finished, together (a drafter
        that must do work per kept slot does it for all of them in one pass)."""
        for slot, tokens in releases:
            self.release(slot, tokens)

    def tidy(self) -> None:
        """Called once per step, after its commits: time to bound what requests that do not draft
        pile up (their taps)."""

    def catch_up(self, slot: int, committed: int) -> int:
        """Positions the next proposal for `slot` (a request with `committed` tokens) must absorb
        before it drafts: one step's accepted tokens, or all that steps without drafting (and the
        prompt) piled up. What adaptive speculation pays on top of a drafting step's own time."""
        return 0

    @abstractmethod
    def propose(self, rows: list[DraftRow], k: int) -> Proposal:
        """Draft `k` tokens after each row's committed tokens, all rows in one batched pass."""

    max_tree_depth: int = 64  # deepest tree node this drafter can score (a block drafter: its block)

    def tree_depth(self, tree: TreeConfig) -> int:
        """Depth of this drafter's trees under `tree`: its `depth`, else num_draft_tokens."""
        return min(tree.depth or self.num_draft_tokens, self.max_tree_depth)

    def propose_tree(self, rows: list[DraftRow], tree: TreeConfig) -> DraftTree:
        """Draft a token tree after each row's committed tokens, all rows batched."""
        raise NotImplementedError(f"the {self.method} drafter drafts chains only; remove drafter.tree")


class NoDrafter(Drafter):
    """Plain autoregressive decoding through the same loop: nothing is ever drafted."""

    method = "none"
    num_draft_tokens = 0

    def begin(self, slot, prompt, hidden, reused=0):
        pass

    def reusable(self, slot, prompt):
        return len(prompt)  # no state of its own

    def propose(self, rows, k):
        raise RuntimeError("NoDrafter drafts nothing; the loop never asks it")


class PendingTaps:
    """The target taps a drafter has received but not yet consumed, per slot (several commits
    can pile up when steps run without drafting), and how many positions they stand for.

    `window`: the drafter reads only the newest `window` positions of a pile (EAGLE-3 restarts
    from them); older commits are dropped as newer ones cover the window, so a long stretch of
    plain decoding holds at most about `window` positions of taps per request, not all of them
    (on an 8B target 24 KB a position)."""

    def __init__(self, window: int | None = None):
        self.window = window
        self.by_slot: dict[int, list[torch.Tensor]] = {}
        self.positions: dict[int, int] = {}  # the pile, dropped commits included
        self.kept: dict[int, int] = {}  # positions the slot's kept commits hold

    def add(self, slot: int, hidden: torch.Tensor | None) -> None:
        if hidden is None or not hidden.shape[0]:
            return
        parts = self.by_slot.setdefault(slot, [])
        parts.append(hidden)
        self.positions[slot] = self.positions.get(slot, 0) + hidden.shape[0]
        kept = self.kept.get(slot, 0) + hidden.shape[0]
        while self.window is not None and kept - parts[0].shape[0] >= self.window:
            kept -= parts.pop(0).shape[0]
        self.kept[slot] = kept

    def take(self, slot: int) -> torch.Tensor | None:
        """The slot's kept taps [n, D] in order, the newest of its pile (all of it without a
        window; None if there are none), now consumed."""
        self.positions.pop(slot, None)
        self.kept.pop(slot, None)
        parts = self.by_slot.pop(slot, None)
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def clear(self, slot: int | None = None) -> None:
        if slot is None:
            self.by_slot.clear()
            self.positions.clear()
            self.kept.clear()
        else:
            self.by_slot.pop(slot, None)
            self.positions.pop(slot, None)
            self.kept.pop(slot, None)


class TapsDrafter(Drafter):
    """A drafter fed by the target's taps: per slot, how many target positions it has absorbed
    (`ctx_len`) and the taps it has received since (`pending`), absorbed by its next proposal."""

    pending_window: int | None = None  # the newest positions of a pile the drafter reads (None: all)

    def allocate(self, num_slots, capacity):
        self.ctx_len: dict[int, int] = {}
        self.pending = PendingTaps(self.pending_window)
        self.held: dict[int, list[int]] = {}  # released slot -> the tokens of its kept context
        self.num_forwards = 0

    def begin(self, slot, prompt, hidden, reused=0):
        if reused > self.reusable(slot, prompt):
            raise ValueError(f"{self.method} slot {slot} cannot keep {reused} positions of this prompt; "
                             f"it holds {self.reusable(slot, prompt)}")
        self.held.pop(slot, None)
        self.ctx_len[slot] = reused
        self.pending.clear(slot)
        self.pending.add(slot, hidden)

    def reusable(self, slot, prompt):
        """The context position i is projected from the target's taps at i alone, which depend on
        tokens 0..i: valid while those match (of the positions absorbed by release)."""
        return common_prefix(self.held.get(slot, ()), prompt)

    def commit(self, slot, num_accepted, hidden):
        self.pending.add(slot, hidden)

    def catch_up(self, slot, committed):
        return self.pending.positions.get(slot, 0)

    def release(self, slot, tokens=None):
        absorbed = self.ctx_len.pop(slot, 0)
        self.pending.clear(slot)
        if tokens is None:
            self.held.pop(slot, None)
        else:
            self.held[slot] = list(tokens[:absorbed])


def common_prefix(a, b) -> int:
    """How many leading items `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


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
