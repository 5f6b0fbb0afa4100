"""The draft–verify loop over R concurrent requests: one target forward per cycle for all of them.

    step:    each running request drafts k tokens (with confidences, for DSpark)
             the schedule picks how many of each request's drafts to verify (a prefix L_r)
             ONE target forward over every newly added prompt (its prefill, giving its first
             token) and every running [last_r, x_r1..x_rL_r]; verify each row; rewind L_r − a_r

Requests join between steps (`add`) and leave when done (continuous batching, as a serving
loop needs it); `generate` adds a fixed group and steps until all are done.

Per request this is exactly `SpeculativeDecoder`'s cycle with the block truncated to L_r, so
the same verifier keeps it lossless as long as L_r never depends on the drafts it admits (see
`spec.schedule`). Each request keeps its own sampling parameters and generator.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trtspec.config import ScheduleConfig
from trtspec.models.drafter import Drafter, NoDrafter, Proposal
from trtspec.models.packed_target import Chunk, PackedSlots
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.sampling import SamplingParams, probs_from_logits, sample
from trtspec.spec.schedule import SPSTable, schedule_lengths, survival
from trtspec.spec.verify import Verifier


@dataclass(slots=True)
class Request:
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_new_tokens: int = 0  # EOS is not honoured before this many tokens (emitted, decoding goes on)
    end_id: int | None = None  # the id that ends this request; None = the tokenizer's eos


# streaming: called with the ids a step emitted for a request; True ends that request after them
OnTokens = Callable[[list[int]], bool | None]


@dataclass(slots=True)
class _Live:
    """One request in flight."""

    request: Request
    drafter: Drafter
    generator: torch.Generator
    result: GenerationResult
    on_tokens: OnTokens | None = None
    added_at: float = 0.0
    generated: list[int] = field(default_factory=list)
    done: bool = False


def _truncate(proposal: Proposal, length: int) -> Proposal:
    q = None if proposal.q_probs is None else proposal.q_probs[:, :length]
    c = None if proposal.confidence is None else proposal.confidence[:, :length]
    return Proposal(tokens=proposal.tokens[:, :length], q_probs=q, confidence=c)


class BatchDecoder:
    """Serves R requests at once over a packed target (`PackedTarget`, or `EnginePackedTarget` in
    the engine flavour); drafters are forked per request."""

    def __init__(self, target: PackedSlots, drafter: Drafter | None, eos_id: int | None,
                 schedule: ScheduleConfig | None = None, sps: SPSTable | None = None,
                 verifier: Verifier | None = None):
        self.target = target
        self.verifier = verifier or Verifier()
        self.drafter = drafter or NoDrafter()
        self.eos_id = eos_id
        self.schedule = schedule or ScheduleConfig()
        if self.schedule.mode in ("scheduler", "argmax") and sps is None:
            raise ValueError("the scheduler needs the target's SPS table: run `trtspec profile` first")
        self.sps = sps
        self.reset()

    def _first_token(self, logits: torch.Tensor, live: _Live) -> int:
        sampling = live.request.sampling
        if sampling.greedy:
            return int(logits.argmax(-1))
        return int(sample(probs_from_logits(logits[None], sampling), live.generator))

    def _lengths(self, proposals: list[Proposal]) -> list[int]:
        full = [p.num_tokens for p in proposals]
        if self.schedule.mode == "full" or any(p.confidence is None for p in proposals if p.num_tokens):
            return full
        surv = [survival(p.confidence[0]) if p.num_tokens else torch.zeros(0) for p in proposals]
        return schedule_lengths(surv, self.sps, self.schedule.mode, self.schedule.threshold)

    def _finish(self, live: _Live, emitted: list[int]) -> None:
        request = live.request
        end_id = self.eos_id if request.end_id is None else request.end_id
        emitted = emitted[: request.max_new_tokens - len(live.generated)]
        # the first end id at or past position min_new_tokens ends the request (positions count from 1)
        for i, token in enumerate(emitted):
            if token == end_id and len(live.generated) + i + 1 >= request.min_new_tokens:
                emitted, live.done = emitted[: i + 1], True
                break
        live.generated.extend(emitted)
        stop = live.on_tokens is not None and bool(live.on_tokens(emitted))
        if stop or len(live.generated) >= request.max_new_tokens:
            live.done = True

    # -- continuous batching ----------------------------------------------------------------

    def reset(self) -> None:
        """Forget every request and empty the target's cache."""
        self.target.reset()
        self.lives: dict[int, _Live] = {}  # requests added and not finished, by id
        self._next_id = 0
        self.num_cycles = 0  # steps that verified drafts
        self.offered_drafts = 0  # drafts proposed, over all cycles and requests
        self.admitted_drafts = 0  # drafts the schedule sent to the target

    def add(self, request: Request, on_tokens: OnTokens | None = None) -> int:
        """Queue `request`; it is prefilled in the next `step`. Returns its id."""
        if not request.prompt:
            raise ValueError("prompt is empty")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if not 0 <= request.min_new_tokens <= request.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens={request.max_new_tokens}], "
                             f"got {request.min_new_tokens}")
        rid, self._next_id = self._next_id, self._next_id + 1
        self.lives[rid] = _Live(request, copy.copy(self.drafter), request.sampling.generator(),
                                GenerationResult(prompt_len=len(request.prompt),
                                                 num_draft_tokens=self.drafter.num_draft_tokens),
                                on_tokens, time.perf_counter())
        return rid

    @property
    def num_running(self) -> int:
        return len(self.lives)

    def step(self) -> dict[int, GenerationResult]:
        """One packed target forward for every request; returns the requests that finished."""
        lives, target = self.lives, self.target
        if not lives:
            return {}
        new = [r for r, lv in lives.items() if lv.result.num_target_calls == 0]
        running = [r for r in lives if r not in new]

        # 1. draft: every running request proposes up to k tokens (never past its budget)
        proposals = []
        for r in running:
            lv = lives[r]
            k = min(lv.drafter.num_draft_tokens, lv.request.max_new_tokens - len(lv.generated) - 1)
            t_draft = time.perf_counter()
            committed = lv.request.prompt + lv.generated
            proposals.append(lv.drafter.propose(committed, k, lv.request.sampling, lv.generator)
                             if k else Proposal.empty())
            lv.result.draft_s += time.perf_counter() - t_draft

        # 2. schedule, then prefill the new prompts and verify all admitted prefixes in ONE forward
        lengths = self._lengths(proposals)
        self.offered_drafts += sum(p.num_tokens for p in proposals)
        self.admitted_drafts += sum(lengths)
        proposals = [_truncate(p, n) for p, n in zip(proposals, lengths, strict=True)]
        chunks = [Chunk(r, torch.tensor(lives[r].request.prompt)) for r in new]
        chunks += [Chunk(r, torch.cat([torch.tensor([lives[r].generated[-1]]), p.tokens[0]]))
                   for r, p in zip(running, proposals, strict=True)]
        outs = target.forward(chunks)
        if running:
            self.num_cycles += 1
        now = time.perf_counter()

        # 3a. new requests: their first token
        for r, out in zip(new, outs, strict=False):
            lv = lives[r]
            lv.drafter.begin(lv.request.prompt, None if out.hidden is None else out.hidden[None])
            lv.result.prefill_s = now - lv.added_at
            lv.result.num_target_calls = 1
            self._finish(lv, [self._first_token(out.logits[-1], lv)])

        # 3b. running requests: verify, rewind the rejected slots, emit
        for r, p, out in zip(running, proposals, outs[len(new):], strict=True):
            lv = lives[r]
            k = p.num_tokens
            verdict = self.verifier.verify(p.tokens, p.q_probs, out.logits[None], lv.request.sampling,
                                           lv.generator)
            a = int(verdict.num_accepted[0])
            target.rewind(r, k - a)
            lv.drafter.commit(a, None if out.hidden is None else out.hidden[None, : a + 1])
            lv.result.record_cycle(num_drafted=k, num_accepted=a)
            lv.result.num_target_calls += 1
            self._finish(lv, verdict.row(0))

        finished = {}
        for r in [r for r, lv in lives.items() if lv.done]:
            lv = lives.pop(r)
            lv.result.total_s = time.perf_counter() - lv.added_at
            lv.result.token_ids = lv.generated
            target.release(r)
            finished[r] = lv.result
        target.compact()
        return finished

    def cancel(self, rid: int) -> None:
        """Drop a request (its client went away) and free its cache slots."""
        if self.lives.pop(rid, None) is not None:
            self.target.release(rid)

    # -- a fixed group ----------------------------------------------------------------------

    def generate(self, requests: list[Request]) -> list[GenerationResult]:
        """Serve `requests` together from an empty cache until all are done."""
        self.reset()
        ids = []
        for i, req in enumerate(requests):
            try:
                ids.append(self.add(req))
            except ValueError as exc:
                self.reset()
                raise ValueError(f"request {i}: {exc}") from None
        results: dict[int, GenerationResult] = {}
        while self.lives:
            results.update(self.step())
        return [results[i] for i in ids]
