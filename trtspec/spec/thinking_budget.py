"""A reasoning budget: at most `budget` tokens inside a thinking model's `<think> … </think>` block,
then the block's end forced, token by token (TensorRT-LLM's `thinking_token_budget`, Anthropic's
`thinking.budget_tokens`).

Like the penalties (`spec.penalties`), what it does at a position is a function of the tokens
before it: where the path (the generated tokens, then the drafts on the way) is inside the block
with the budget spent, p keeps only the end's next token. So p at every draft position is the
budgeted target's law and the accept rule runs on it unchanged; a draft that disagrees with a
forced token is rejected and the forced token takes its place.

Where a path stands (`BudgetState`): `opening` while the answer's first tokens match `start`, the
tokens that open the block (when the answer starts inside it, `start` is empty and the path begins
`inside`); `inside` counting the block's tokens; `after` once they end with `end` (the model's
own, or the forced one) or the answer opened no block. Counted in tokens, as the budget is: a
tag the model writes in other tokens than `start` / `end` tokenize to is not recognised.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

OPENING, INSIDE, AFTER = "opening", "inside", "after"


@dataclass(frozen=True, slots=True)
class BudgetState:
    phase: str  # OPENING, INSIDE or AFTER
    count: int = 0  # opening: the start's tokens matched; inside: the block's tokens so far
    tail: tuple[int, ...] = ()  # inside: the block's last tokens, as many as the end has


class ThinkingBudget(BaseModel):
    """A request's reasoning budget, its block's opening and end as token ids."""

    model_config = ConfigDict(frozen=True)

    budget: int = Field(ge=0, description="most tokens inside the block before its end is forced")
    end: tuple[int, ...] = Field(description="the tokens that end the block (</think>)")
    start: tuple[int, ...] = Field((), description="the tokens that open the block at the answer's start; "
                                                   "empty: the answer starts inside it")

    @field_validator("end")
    @classmethod
    def _some_end(cls, end: tuple[int, ...]) -> tuple[int, ...]:
        if not end or min(end) < 0:
            raise ValueError("the block's end must be one or more token ids")
        return end

    def first(self) -> BudgetState:
        """Where an answer stands before its first token."""
        return BudgetState(OPENING) if self.start else BudgetState(INSIDE)

    def after(self, state: BudgetState, token: int) -> BudgetState:
        """Where a path stands once `token` follows it."""
        if state.phase == OPENING:
            if token != self.start[state.count]:
                return BudgetState(AFTER)  # the answer opened no block
            count = state.count + 1
            return BudgetState(INSIDE) if count == len(self.start) else BudgetState(OPENING, count)
        if state.phase == INSIDE:
            tail = (state.tail + (token,))[-len(self.end):]
            return BudgetState(AFTER) if tail == self.end else BudgetState(INSIDE, state.count + 1, tail)
        return state

    def forced(self, state: BudgetState) -> int | None:
        """The token a path must take next: the end's next one once the budget is spent inside the
        block (the count goes on over the forced tokens, so the k-th past the budget is end[k])."""
        if state.phase != INSIDE or state.count < self.budget:
            return None
        return self.end[min(state.count - self.budget, len(self.end) - 1)]
