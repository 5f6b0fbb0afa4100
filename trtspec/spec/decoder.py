"""The draft–verify loop, for one request or many: every step is ONE drafter pass for all running
requests, ONE target forward, ONE verifier call.

    step:  pick the draft length k ≥ 0 for the running batch (the schedule; k = 0: plain decoding)
           draft k tokens for every running request in one batched proposal (with confidences,
           for DSpark), and let the schedule pick each request's verified prefix L_r
           ONE target forward over the new prompts' next pieces (at most `prefill_chunk` prompt
           tokens in all: chunked prefill; a prompt's last piece gives its first token) and
           every running [last_r, x_r1..x_rL_r], each request in its own cache slot
           verify all rows at once (ragged L_r, each row under its own sampling parameters)
           rewind each slot by L_r − a_r, a non-negative count: a length change, nothing moves

With `tree` (`trtspec.spec.tree`) each drafting request sends a token tree instead of a chain: its
nodes are fed in the same one target forward (each seeing the context and its ancestors), verified
by `Verifier.verify_tree`, and `TargetModel.keep_paths` keeps the accepted root path's K/V.

Requests join between steps (`add`) and leave when done (continuous batching); `generate` runs
one request alone (R = 1 of the same loop), `generate_batch` a fixed group. Per request this is
exactly the one-request draft–verify cycle with the block truncated to L_r, so the verifier keeps
it lossless as long as k and L_r never depend on the drafts' verdict (`spec.schedule`, `spec.cost`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from trtspec.config import LookupConfig, ScheduleConfig, TreeConfig
from trtspec.models.drafter import Drafter, DraftRow, NoDrafter, Proposal, common_prefix
from trtspec.models.target import Chunk, PathKeep, TargetModel
from trtspec.spec.cost import AcceptanceTracker, GainCalibration, MeasuredCost, admit_rows
from trtspec.spec.coupling import fresh_seed
from trtspec.spec.grammar import GuideState
from trtspec.spec.logprobs import TokenLogprobs, prompt_logprobs, step_logprobs
from trtspec.spec.lookup import KEY_BITS, LookupPool, PromptLookup
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.penalties import Penalties
from trtspec.spec.prediction import PREDICTION_DRAFTS, PredictedDrafts
from trtspec.spec.sampling import SamplingParams, choose_tokens
from trtspec.spec.schedule import SPSTable, schedule_lengths, survival
from trtspec.spec.tree import DraftTree
from trtspec.spec.verify import Verifier

REQUEST_DECAY = 0.9  # per step: how fast a request's acceptance counts fade back toward the prior
PROBE_LEN = 4  # drafts per request of a probe step (a drafter with confidences: its whole block)
PROBE_BACKOFF = 32  # the probe interval grows up to this many times schedule.probe_every
CONTEXT_STEP = 32  # the cost model reads the step's context rounded up to a multiple of this
CATCH_UP_STEP = 8  # ... and each request's drafter catch-up rounded up to a multiple of this
# prompt tokens a forward scores at most for prompt_logprobs: a longer prompt is fed in pieces of
# this many, so its logits are never all held at once ([P, V] floats: 5.0 GB for 8k tokens of
# Qwen3's 151,936-token vocabulary, against 0.3 GB per 512)
PROMPT_LOGPROBS_CHUNK = 512
# a request's catch-up is paid once and lets it draft on: the cost model spreads it over the steps
# the request is expected to draft, at most this many (charged whole to one step, EAGLE-3's 32
# positions at R = 8 cost about 7 ms beside an 8 ms plain step and kept a batch plain for good
# while fixed k = 1 served 1.08-1.10x the target alone)
CATCH_UP_HORIZON = 8


# fewest prompt positions a request keeps from a free slot (prefix reuse): a shorter match counts as
# none, so the request takes the least recently used slot instead of one whose held conversation it
# would overwrite for a saving of a few tokens (vLLM caches whole blocks of 16 tokens, TensorRT-LLM
# of tokens_per_block = 32)
MIN_REUSE = 16


class PromptError(ValueError):
    """The prompt does not fit this decoder (empty, or longer than its limits allow)."""


@dataclass(slots=True)
class Request:
    prompt: list[int]
    max_new_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    min_new_tokens: int = 0  # no end id is emitted before this many tokens
    end_id: int | None = None  # the one id that ends this request; None: the decoder's end ids
    stop_ids: tuple[int, ...] = ()  # more ids that end this request (vLLM's stop_token_ids)
    ignore_eos: bool = False  # the end ids (the decoder's or end_id) do not end it; stop_ids still do
    # None: no log-probabilities; n >= 0: each emitted token's log p and the n most likely tokens'
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # the same for the prompt's tokens after its first
    # a compiled guide (`spec.grammar.GuideCompiler.compile`): the text must match it
    guide: object | None = None
    # predicted outputs: token ids the answer is expected to repeat, drafted from (`spec.prediction`)
    prediction: tuple[int, ...] = ()
    # what this request shares with earlier ones, by what it was sent with (vLLM's cache_salt): the K/V
    # a finished request left in a slot (prefix reuse) and the lookup pool's texts, those of requests
    # with the same salt only, so one tenant's speed cannot tell what another sent
    cache_salt: str = ""


@dataclass(slots=True)
class _Drafts:
    """What one step feeds the target for the running requests."""

    k: int  # the drafter's draft length this step (a tree: its deepest node); 0 = it drafts nothing
    fed: torch.Tensor  # [R, W+1] each row's last token, then its drafts (chain) or nodes (tree)
    lengths: list[int]  # drafts (tree nodes) each row sends to the target
    drafting: list[int]  # rows that drafted
    q: torch.Tensor | None = None  # [R, k, V] chain draft distributions (sampling rows)
    tree: DraftTree | None = None  # tree mode: every running row's tree (size 0 = no drafts)
    depths: list[int] = field(default_factory=list)  # positions each row offers (tree: its depth)
    looked_up: set[int] = field(default_factory=set)  # rows whose drafts came from prompt lookup
    # adaptive: the drafts the cost model expected the drafting rows to get accepted, summed (None:
    # not its choice, e.g. a probe); what `GainCalibration` holds the verdicts against
    expected: float | None = None


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def _draft_row(lv: _Live) -> DraftRow:
    return DraftRow(lv.slot, lv.committed, lv.request.sampling, lv.generator, lv.grammar)


@dataclass(slots=True)
class Emitted:
    """What one step gave one request."""

    ids: list[int]  # its new tokens
    logprobs: TokenLogprobs | None = None  # theirs, when the request asked for them
    prompt_logprobs: TokenLogprobs | None = None  # with its first token: its prompt's, when asked
    cached_tokens: int = 0  # with its first token: the prompt tokens kept from a slot (prefix reuse)


# streaming: called with what each step emitted for a request; True ends that request after it
OnTokens = Callable[[Emitted], bool | None]


@dataclass(slots=True)
class _Prefill:
    """A new request's prompt on its way into the target's cache, a piece per step (`_prefill_pieces`)."""

    fed: int  # prompt tokens already in the target's cache
    reused: int  # of them, those held from the slot's previous request (prefix reuse)
    logprobs: TokenLogprobs | None  # of the prompt's tokens 1..fed, when the request asked for them
    hidden: list[torch.Tensor] = field(default_factory=list)  # the target's taps of the pieces ([n, D] each)


@dataclass(slots=True)
class _Live:
    """One request in flight."""

    request: Request
    slot: int
    generator: torch.Generator
    result: GenerationResult
    acceptance: AcceptanceTracker
    prefill: _Prefill | None  # until its prompt is all in the target's cache; then None
    on_tokens: OnTokens | None = None
    added_at: float = 0.0
    generated: list[int] = field(default_factory=list)
    logprobs: TokenLogprobs | None = None  # of `generated`, when the request asked for them
    penalties: Penalties | None = None  # when its sampling has logit bias or penalties
    grammar: GuideState | None = None  # when it has a guide
    prediction: PredictedDrafts | None = None  # when it sent a prediction (chains; no guide)
    lookup: PromptLookup | None = None  # its own tokens, when the decoder drafts by prompt lookup
    done: bool = False

    @property
    def committed(self) -> list[int]:
        return self.request.prompt + self.generated

    @property
    def budget(self) -> int:
        """Drafts this request may still verify: a step emits at most k + 1 tokens."""
        return self.request.max_new_tokens - len(self.generated) - 1


class SpeculativeDecoder:
    """Serves up to `max_slots` requests at once over a target and a drafter (both copied and given
    their own slot buffers, so several decoders can share one loaded pipeline)."""

    def __init__(self, target: TargetModel, drafter: Drafter | None, end_ids: Iterable[int],
                 verifier: Verifier | None = None, schedule: ScheduleConfig | None = None,
                 cost_table: SPSTable | None = None, max_slots: int = 1, capacity: int | None = None,
                 acceptance_prior: list[float] | None = None, max_prompt: int | None = None,
                 tree: TreeConfig | None = None, prompt_logprobs_chunk: int = PROMPT_LOGPROBS_CHUNK,
                 prefill_chunk: int | None = None, prefix_reuse: bool = False,
                 lookup: LookupConfig | None = None):
        self.target = copy.copy(target)
        self.drafter = copy.copy(drafter or NoDrafter())
        self.tree = tree if self.drafter.num_draft_tokens else None
        if lookup is not None and self.tree is not None:
            raise ValueError("prompt lookup drafts chains, and this decoder verifies trees: drop one of them")
        self.lookup = lookup  # drafts copied from each request's own tokens (`spec.lookup`); None: off
        if lookup is not None and lookup.pool_tokens and self.target.vocab_size > 1 << KEY_BITS:
            raise ValueError(f"lookup.pool_tokens: the pool keys token ids in {KEY_BITS} bits, and this "
                             f"target's vocabulary has {self.target.vocab_size} ids; set it to 0")
        # finished requests' tokens, for every request to copy from (lookup.pool_tokens; None: off)
        self.pool = LookupPool(lookup.pool_tokens) if lookup is not None and lookup.pool_tokens else None
        self.end_ids = frozenset(end_ids)  # a request ends at the first of these it emits
        self.verifier = verifier or Verifier()
        self.schedule = schedule or ScheduleConfig(mode="full")
        needs_table = self.schedule.mode in ("scheduler", "argmax", "adaptive")
        if needs_table and self.drafter.num_draft_tokens and cost_table is None:
            raise ValueError(f"schedule mode {self.schedule.mode!r} needs the target's SPS table: run "
                             "`trtspec profile` first")
        self.cost_table = cost_table
        self.cost = None if cost_table is None else MeasuredCost(cost_table)
        window = getattr(self.target, "sliding_window", None)
        if self.tree is not None and window is not None and self.num_draft_tokens >= window:
            # the slot attention bands keys by where they are stored, a tree node's by its node index
            raise ValueError(f"drafter.tree depth {self.num_draft_tokens} reaches the target's sliding "
                             f"window of {window} positions; set drafter.tree.depth below {window}")
        self.max_slots = max_slots
        self.capacity = capacity or self.target.max_positions
        # a tree's nodes may outnumber the tokens a request has left, and EAGLE-3 / draft models
        # write each depth's frontier after the committed tokens: room for both
        tree_room = 0 if self.tree is None else self.tree.nodes + self.tree.topk * self.num_draft_tokens
        self.max_prompt = max_prompt  # limits.max_input_tokens
        self.prompt_logprobs_chunk = prompt_logprobs_chunk
        # prompt tokens one step feeds at most, over all new requests (limits.prefill_chunk; None: all)
        self.prefill_chunk = prefill_chunk
        # a new request starts from what a free slot still holds of its prompt (`_pick_slot`)
        self.prefix_reuse = prefix_reuse and getattr(self.target, "reuses_prefixes", False)
        self.target.allocate(max_slots, self.capacity + tree_room)
        self.drafter.allocate(max_slots, self.capacity + tree_room)
        self.acceptance_prior = acceptance_prior
        self._mask_worker: ThreadPoolExecutor | None = None  # fills guided rows' masks beside the forward
        self.reset()

    @property
    def num_draft_tokens(self) -> int:
        """Draft positions the drafter may gain a request per step: k, or a tree's depth."""
        if self.tree is not None:
            return self.drafter.tree_depth(self.tree)
        return self.drafter.num_draft_tokens

    @property
    def num_draft_tokens_stat(self) -> int:
        """Draft positions a request's statistics count (`GenerationResult.num_draft_tokens`): the
        drafter's, or prompt lookup's when it copies more."""
        return max(self.num_draft_tokens, self.lookup.num_draft_tokens if self.lookup else 0)

    # -- continuous batching ----------------------------------------------------------------

    def reset(self) -> None:
        """Forget every request and what their acceptance taught (the buffers stay allocated), so
        a seeded request decodes the same whatever ran before it."""
        for slot in range(self.max_slots):
            self.target.release(slot)
            self.drafter.release(slot)  # without its tokens: nothing held
        # free slot -> the tokens whose K/V its target buffers still hold (prefix reuse), and when
        # each slot was last taken (the least recently used goes first when no prefix matches)
        self.held: dict[int, list[int]] = {}
        self.held_salt: dict[int, str] = {}  # the cache_salt of the request that left it
        self.taken_at: dict[int, int] = {}
        self.target.num_forwards = 0
        self.lives: dict[int, _Live] = {}  # requests added and not finished, by id
        self._next_id = 0
        self.num_steps = 0  # steps of this decoder (one packed target forward each)
        self.num_cycles = 0  # steps that verified running requests
        self.offered_drafts = 0  # drafts proposed, over all steps and requests
        self.admitted_drafts = 0  # drafts the schedule sent to the target
        self.draft_len_counts: dict[int, int] = {}  # k picked -> steps (with running requests)
        self.num_probes = 0  # adaptive steps that drafted only to learn (`_probe`)
        self._plan_key: tuple | None = None  # what the last adaptive choice `_plan` was made from
        # k, the admitted rows, and the drafts the estimates expect them to get accepted, summed
        self._plan: tuple[int, list[int], float] = (0, [], 0.0)
        self._plan_catch_up: list[int] = []  # the catch-ups (rounded) it was made with
        self._probe_wait = 1  # steps without drafting before the next probe: the first one probes
        self._idle_steps = 0
        # every request's acceptance estimate leans on what all requests showed so far
        self.population = AcceptanceTracker(self.num_draft_tokens, prior=self.acceptance_prior)
        # the same for drafts copied by prompt lookup, by how many tokens the copy's place matched
        # (1..max_match): on the embedded model a 1-token match's first copy is accepted 17 % of the
        # time, an 8-token match's 76 %; apart for copies from the request's own tokens and the pool's
        self.lookup_acceptance = {(pooled, m): AcceptanceTracker(self.lookup.num_draft_tokens)
                                  for pooled in (False, True)
                                  for m in range(1, self.lookup.max_match + 1 if self.lookup else 1)}
        if self.pool is not None:  # forgotten too: the texts other requests left
            self.pool.clear()
        self.calibration = GainCalibration()  # accepted / expected drafts of recent steps

    def check(self, request: Request) -> None:
        """Refuse a request this decoder cannot serve, naming the numbers."""
        if not request.prompt:
            raise PromptError("prompt is empty")
        if request.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if not 0 <= request.min_new_tokens <= request.max_new_tokens:
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens={request.max_new_tokens}], "
                             f"got {request.min_new_tokens}")
        if self.max_prompt is not None and len(request.prompt) > self.max_prompt:
            raise PromptError(f"prompt of {len(request.prompt)} tokens exceeds limits.max_input_tokens "
                             f"{self.max_prompt}")
        vocab = self.target.vocab_size
        outside = [token for token, _ in request.sampling.logit_bias if token >= vocab]
        if outside:
            raise ValueError(f"logit_bias names token {outside[0]}, outside the target's vocabulary of "
                             f"{vocab}")
        ends = self.end_ids_of(request)
        if request.min_new_tokens and len(ends) >= vocab and ends.issuperset(range(vocab)):
            # every logit would be banned: NaN probabilities, or token 0 ending it at once
            raise ValueError(f"min_tokens {request.min_new_tokens} cannot be met: the end ids and stop ids "
                             f"cover all {vocab} tokens of the vocabulary, so any token would end it")
        if request.guide is not None and request.min_new_tokens:
            raise ValueError(f"min_tokens {request.min_new_tokens} cannot be combined with a guide: the "
                             "grammar decides where the text may end")
        if any(not 0 <= token < vocab for token in request.prediction):
            raise ValueError(f"the prediction holds a token id outside the target's vocabulary of {vocab}")
        if len(request.prediction) > self.capacity:
            raise ValueError(f"the prediction holds {len(request.prediction)} tokens, more than this "
                             f"deployment's context of {self.capacity}")
        if request.guide is not None and not ends:
            raise ValueError("ignore_eos leaves a guided request no id that ends it: give stop_token_ids, "
                             "or drop ignore_eos")
        need = len(request.prompt) + request.max_new_tokens
        if need > self.capacity:
            raise PromptError(f"prompt of {len(request.prompt)} tokens + max_tokens {request.max_new_tokens} "
                             f"= {need} tokens exceeds this deployment's context of {self.capacity}")

    def add(self, request: Request, on_tokens: OnTokens | None = None) -> int:
        """Queue `request`; it is prefilled in the next `step`. Returns its id."""
        self.check(request)
        if not request.sampling.greedy and request.sampling.seed is None:
            # drawn here and reported (`GenerationResult.seed`), so the text can be sampled again;
            # Gumbel coupling's noise needs it as its key
            request = copy.copy(request)
            request.sampling = request.sampling.model_copy(update={"seed": fresh_seed()})
        used = {lv.slot for lv in self.lives.values()}
        free = [s for s in range(self.max_slots) if s not in used]
        if not free:
            raise RuntimeError(f"all {self.max_slots} slots are busy; add requests as others finish")
        rid, self._next_id = self._next_id, self._next_id + 1
        slot, reused = self._pick_slot(free, request)
        self.held.pop(slot, None)
        self.taken_at[slot] = rid
        self.target.reuse(slot, reused)
        result = GenerationResult(prompt_len=len(request.prompt), num_draft_tokens=self.num_draft_tokens_stat,
                                  seed=request.sampling.seed, cached_tokens=reused)
        tracker = AcceptanceTracker(self.num_draft_tokens, prior=self.population, decay=REQUEST_DECAY)
        top = request.prompt_logprobs
        prefill = _Prefill(reused, reused, None if top is None else TokenLogprobs(top))
        live = _Live(request, slot, request.sampling.generator(self.target.device), result, tracker,
                     prefill, on_tokens, time.perf_counter())
        if request.logprobs is not None:
            live.logprobs = TokenLogprobs(request.logprobs)
        if request.sampling.penalized:
            live.penalties = Penalties(request.sampling, request.prompt, self.target.vocab_size,
                                       self.target.device)
        if request.guide is not None:
            live.grammar = GuideState(request.guide, self.end_ids_of(request), self.target.vocab_size)
        elif request.prediction:  # a guided row drafts what its guide allows
            live.prediction = PredictedDrafts(request.prediction)
        if self.lookup is not None:  # a guided row's copies are cut where its guide refuses one
            live.lookup = PromptLookup(request.prompt, self.lookup.min_match, self.lookup.max_match,
                                       request.cache_salt)
        self.lives[rid] = live
        return rid

    def _pick_slot(self, free: list[int], request: Request) -> tuple[int, int]:
        """The free slot for `request` and the prompt positions it keeps from what that slot holds
        (automatic prefix caching, as vLLM's and TensorRT-LLM's block reuse): the slot where the
        most stay valid in the target AND the drafter (`Drafter.reusable`), at most all but the
        prompt's last token, whose logits give the first new one, and at least MIN_REUSE; none
        matching: the least recently taken slot. Requests asking for prompt_logprobs keep nothing
        (their whole prompt is scored)."""
        if not self.prefix_reuse:
            return free[0], 0
        prompt = request.prompt

        def worth(slot: int) -> tuple[int, int, int]:  # positions kept, then the least recently taken
            held = self.held.get(slot, ()) if self.held_salt.get(slot, "") == request.cache_salt else ()
            common, kept = common_prefix(held, prompt), 0
            if request.prompt_logprobs is None and common >= MIN_REUSE:
                kept = min(common, len(prompt) - 1, self.drafter.reusable(slot, prompt))
            kept = kept if kept >= MIN_REUSE else 0  # a few shared tokens (a BOS, a role tag) spare
            # no prefill worth having, and would give away what the slot holds
            return kept, -self.taken_at.get(slot, -1), -slot

        slot = max(free, key=worth)
        return slot, worth(slot)[0]

    def _free(self, lives: list[_Live]) -> None:
        """Release the slots of `lives`, their target and drafter state held for a later prompt that
        starts the same (the tokens whose K/V the target holds; the drafter keeps what it can,
        `release`; all of a step's finished requests in one `release_many`)."""
        if self.prefix_reuse:  # off: nothing is held, and `_pick_slot` never looks
            for lv in lives:
                # cut off in its prefill, the request's prompt fed so far (its drafter state is
                # still the previous request's, which `Drafter.reusable` bounds)
                self.held[lv.slot] = lv.committed[: self.target.seq_len(lv.slot)] if lv.prefill is None \
                    else lv.request.prompt[: lv.prefill.fed]
                self.held_salt[lv.slot] = lv.request.cache_salt
        # a request cut off in its prefill never reached the drafter; reuse off: it keeps nothing
        self.drafter.release_many([(lv.slot, lv.committed if self.prefix_reuse else None)
                                   for lv in lives if lv.prefill is None])
        for lv in lives:
            self.target.release(lv.slot)

    @property
    def num_running(self) -> int:
        return len(self.lives)

    def cancel(self, rid: int) -> None:
        """Drop a request (its client went away) and free its slot."""
        live = self.lives.pop(rid, None)
        if live is not None:
            self._free([live])

    # -- one step ---------------------------------------------------------------------------

    def _draft_plan(self, running: list[_Live], context: int,
                    prompt: int) -> tuple[int, list[int], float | None]:
        """k for this step, the rows (indices into `running`) that draft, and the drafts the cost
        model expects them to get accepted (None: not its choice). The configured maximum for every
        row with budget left, or (adaptive) the k and rows that maximise expected tokens per second
        under the cost model (`spec.cost.admit_rows`; none: plain decoding). A drafter with
        confidences drafts its whole block in the admitted rows (one block pass costs the same at
        any k) and Algorithm 1 then cuts each row from what this step's confidences say, which the
        running acceptance cannot know. `context`: the step's, as `_context` prices it; `prompt`: the
        prompt tokens its forward feeds too (`_prefill_pieces`), which the cost model prices."""
        k_max = min(self.num_draft_tokens, max((lv.budget for lv in running), default=0))
        may = [i for i, lv in enumerate(running) if lv.budget > 0]
        if k_max <= 0 or self.schedule.mode != "adaptive":
            return max(k_max, 0), may, None
        # the estimates change only when a step verifies drafts: until then the choice stands
        catch_up = self._catch_ups(running)
        key = (self.population.version, k_max, context, prompt,
               tuple((lv.slot, lv.acceptance.version, min(k_max, lv.budget)) for lv in running))
        # catch-ups shrink only by drafting, whose verdicts change the key: with the key unchanged
        # they only grew, and a plain plan stays plain
        if key != self._plan_key or (self._plan[1] and catch_up != self._plan_catch_up):
            raw = [lv.acceptance.survival(min(k_max, max(lv.budget, 0))) for lv in running]
            # with confidences the best single k from history is a lower bound on what Algorithm 1's
            # per-row cut of the whole block gains (it sees this step's confidences): no further margin
            min_gain = 0.0 if self.drafter.has_confidence else self.schedule.min_gain
            seconds = self._catch_up_seconds(running, catch_up, [1.0 + sum(a) for a in raw])
            k, rows = admit_rows(self.cost, [self.calibration.scale(s) for s in raw], k_max, min_gain,
                                 context, seconds, prompt)
            self._plan_key, self._plan = key, (k, rows, sum(sum(raw[r][:k]) for r in rows))
            self._plan_catch_up = catch_up
        k, rows, expected = self._plan
        if self._probe(drafting=bool(rows)):
            return (k_max if self.drafter.has_confidence else min(k_max, PROBE_LEN)), may, None
        return (k_max if self.drafter.has_confidence and rows else k), rows, expected

    def _catch_ups(self, running: list[_Live]) -> list[int]:
        """Positions each request's drafter must absorb before it drafts (`Drafter.catch_up`),
        rounded up to CATCH_UP_STEP so a plan is not remade at every step."""
        return [_round_up(self.drafter.catch_up(lv.slot, len(lv.request.prompt) + len(lv.generated)),
                          CATCH_UP_STEP) for lv in running]

    def _catch_up_seconds(self, running: list[_Live], catch_ups: list[int],
                          tokens_per_step: list[float]) -> list[float]:
        """What each request's catch-up adds to a step it drafts in: the time to absorb its pile,
        spread over the steps it is then expected to draft (its remaining budget at the tokens a
        step emits for it, `tokens_per_step`, at most CATCH_UP_HORIZON, at least one)."""
        seconds = []
        for lv, n, tokens in zip(running, catch_ups, tokens_per_step, strict=True):
            steps = min(CATCH_UP_HORIZON, max(1.0, lv.budget / tokens))
            seconds.append(self.cost_table.catch_up_time(len(catch_ups), n) / steps)
        return seconds

    def _context(self, running: list[_Live]) -> int:
        """Cached tokens the step's attention reads per request, as the cost model prices it: the
        longest running request's (a padded attention group reads that many in every row), rounded
        up to CONTEXT_STEP so the adaptive choice is not remade at every step."""
        return _round_up(max((self.target.seq_len(lv.slot) for lv in running), default=0), CONTEXT_STEP)

    def _probe(self, drafting: bool) -> bool:
        """Whether this step, which the cost model would decode plainly, drafts anyway to learn.
        Acceptance is learnt only from what is verified: a batch whose prior (the drafter's pooled
        acceptance) says drafting does not pay would never find out that its requests are easy
        ones (DFlash on math at R = 8: full blocks serve 1.37× plain decoding, and the prior
        never drafted). So the first step without drafting, and then each step after
        `schedule.probe_every` more without, drafts PROBE_LEN tokens per request; each probe that
        leaves drafting off doubles the next wait (up to PROBE_BACKOFF × probe_every), so a
        workload where drafting does not pay costs a few probes per request's life. The decision
        reads step counts only, never the drafts: lossless like any other k."""
        every = self.schedule.probe_every
        if not every:
            return False
        if drafting:
            self._probe_wait, self._idle_steps = every, 0
            return False
        self._idle_steps += 1
        if self._idle_steps < self._probe_wait:
            return False
        self._idle_steps = 0
        wait = self._probe_wait
        self._probe_wait = every if wait < every else min(2 * wait, PROBE_BACKOFF * every)
        self.num_probes += 1
        return True

    def _verify_lengths(self, proposal: Proposal, budgets: list[int], k: int, plain_rows: int,
                        context: int, prompt: int) -> list[int]:
        """Drafts each drafting row sends to the target: its budget, cut by the schedule when the
        drafter has confidences (DSpark's Algorithm 1 with this step's drafting cost, the
        `plain_rows` requests that feed one token beside them, its context and its prompt tokens
        included)."""
        mode = self.schedule.mode
        if mode == "full" or proposal.confidence is None:
            return budgets
        surv = [survival(c[:b]) for c, b in zip(proposal.confidence, budgets, strict=True)]
        table = self.cost_table
        # the step's time besides its target forward: drafting, and the loop's own at this batch
        draft_s = 0.0 if table is None else \
            table.draft_time(len(budgets), k) + table.loop_time(len(budgets) + plain_rows)
        table_mode = "scheduler" if mode == "adaptive" else mode
        return schedule_lengths(surv, self.cost_table, table_mode, self.schedule.threshold, draft_s,
                                plain_rows, context, prompt)

    @staticmethod
    def _along_paths(logits: torch.Tensor, rows: list[_Live], fed: torch.Tensor | None = None,
                     tree: DraftTree | None = None, masks: dict[int, Future] | None = None) -> None:
        """What a row's request asks of p at each position after the committed tokens and the drafts
        on its path: logit bias and penalties (`spec.penalties`), then its guide's mask
        (`spec.grammar`; `masks`: row -> its bitmask being filled, `_fill_masks`).  logits [R, s, V],
        one row per request; fed [R, ≥ s]: each row's last token, then its drafts (or tree nodes);
        None: s = 1."""
        for r, lv in enumerate(rows):
            if lv.penalties is None and lv.grammar is None:
                continue
            drafts = None if fed is None else fed[r, 1:]
            parents = None if tree is None else tree.row_parents(r)
            if lv.penalties is not None:
                lv.penalties.apply(logits[r], drafts, parents)
            if lv.grammar is not None and masks is not None:
                lv.grammar.apply(logits[r], masks[r].result())
            elif lv.grammar is not None:
                lv.grammar.mask(logits[r], drafts, parents)

    @staticmethod
    def _dead_ends(logits: torch.Tensor, rows: list[_Live]) -> dict[int, set[int]]:
        """The positions where a row's guide and bad words leave no token (every logit −inf: a guide
        whose next token is one the request ends on, a stop_token_ids id, or one bad_words bans), by
        row; their logits become 0 there, so the verification draws something defined (NaN otherwise)
        and `_dead_end` ends the request if its path reaches one.  logits [R, s, V]"""
        checked = [r for r, lv in enumerate(rows) if lv.grammar is not None or lv.request.sampling.bad_words]
        if not checked:
            return {}
        idx = torch.tensor(checked, device=logits.device)
        dead = torch.isneginf(logits[idx]).all(-1)  # [C, s]
        if not bool(dead.any()):  # one host sync, in steps with guided or bad-words rows only
            return {}
        out = {}
        for j, r in enumerate(checked):
            if bool(dead[j].any()):
                logits[r, dead[j]] = 0.0
                out[r] = set(dead[j].nonzero()[:, 0].tolist())
        return out

    def _dead_end(self, lv: _Live) -> None:
        """End a request no token may continue (`_dead_ends`), saying why; its earlier tokens stand."""
        causes = [name for name, present in (("its guide", lv.grammar is not None),
                                             ("bad_words", bool(lv.request.sampling.bad_words)),
                                             ("min_tokens", lv.request.min_new_tokens > len(lv.generated)))
                  if present]
        lv.result.error = (f"no token may follow the {len(lv.generated)} tokens generated: "
                           f"{' and '.join(causes)} leave none there (a guide cannot go on with a token "
                           "that ends the request, a stop_token_ids id or an end id, nor with one bad_words "
                           "bans, nor end before min_tokens)")
        lv.done = True

    def _fill_masks(self, rows: list[_Live], plan) -> dict[int, Future] | None:
        """The guided rows' bitmasks for the step's verification, filled on a worker thread from the
        drafts while the target's forward runs (None: no row is guided). Each row's matcher is only
        touched there until `_along_paths` waits for its mask."""
        guided = [r for r, lv in enumerate(rows) if lv.grammar is not None]
        if not guided:
            return None
        if self._mask_worker is None:
            self._mask_worker = ThreadPoolExecutor(1, thread_name_prefix="trtspec-masks")
        s = max(plan.lengths) + 1
        return {r: self._mask_worker.submit(rows[r].grammar.fill, s, plan.fed[r, 1:],
                                            None if plan.tree is None else plan.tree.row_parents(r))
                for r in guided}

    def _ban_end(self, logits: torch.Tensor, rows: list[_Live], tree: DraftTree | None = None) -> None:
        """No end id may be emitted before a request's min_new_tokens: they are removed from p at
        every position whose token would come earlier.  logits [R, s, V], one row per request;
        `tree`: the rows' draft trees (node i of depth d gives the token d after the last one)."""
        for r, (lv, row) in enumerate(zip(rows, logits, strict=True)):
            short = lv.request.min_new_tokens - len(lv.generated)
            if short <= 0:
                continue
            early = slice(short) if tree is None else tree.depths()[r, : row.shape[0]] < short
            for end in self.end_ids_of(lv.request):
                row[early, end] = float("-inf")

    @staticmethod
    def _wanting_logprobs(logits: torch.Tensor, rows: list[_Live]) -> tuple[list[int], torch.Tensor] | None:
        """The rows that asked for log-probabilities and a copy of their logits [W, s, V] (the
        min_tokens ban writes into the step's), or None when no row did.  logits [R, s, V]."""
        wanted = [r for r, lv in enumerate(rows) if lv.logprobs is not None]
        if not wanted:
            return None
        return wanted, logits[torch.tensor(wanted, device=logits.device)]  # indexing copies

    @staticmethod
    def _logprobs(raw: tuple[list[int], torch.Tensor] | None, rows: list[_Live], positions: list[list[int]],
                  emitted: list[list[int]]) -> dict[int, TokenLogprobs]:
        """Each wanting row's emitted tokens' log-probabilities, by row (`spec.logprobs`): token j
        of row r was predicted at positions[r][j] among the row's logits."""
        if raw is None:
            return {}
        wanted, logits = raw
        found = step_logprobs(logits, [positions[r] for r in wanted], [emitted[r] for r in wanted],
                              [rows[r].logprobs.top for r in wanted])
        return dict(zip(wanted, found, strict=True))

    def end_ids_of(self, request: Request) -> frozenset[int]:
        """The ids that end `request` (the first it emits is its last token)."""
        if request.ignore_eos:
            ends = frozenset()
        else:
            ends = self.end_ids if request.end_id is None else frozenset((request.end_id,))
        return ends.union(request.stop_ids) if request.stop_ids else ends

    def _emit(self, lv: _Live, emitted: list[int], logprobs: TokenLogprobs | None = None) -> None:
        """Append a step's tokens (cut at max_new_tokens and the first end id) and stream them;
        `logprobs`: theirs, when the request asked for them (and its prompt's with the first)."""
        ends = self.end_ids_of(lv.request)
        emitted = emitted[: lv.request.max_new_tokens - len(lv.generated)]
        first_end = next((i for i, token in enumerate(emitted) if token in ends), None)
        if first_end is not None:
            emitted = emitted[: first_end + 1]
        lv.generated.extend(emitted)
        if lv.penalties is not None:
            lv.penalties.extend(emitted)
        if lv.grammar is not None:
            lv.grammar.extend(emitted)
        if logprobs is not None:
            logprobs = logprobs.head(len(emitted))
            lv.logprobs.extend(logprobs)
        first = len(lv.generated) == len(emitted)
        prompt, cached = (lv.result.prompt_logprobs, lv.result.cached_tokens) if first else (None, 0)
        stop = lv.on_tokens is not None and bool(lv.on_tokens(Emitted(emitted, logprobs, prompt, cached)))
        # a caller's True is a stop word or sequence (or a client gone, whom no reason reaches)
        if stop or lv.generated[-1] in ends:
            lv.done, lv.result.finish_reason = True, "stop"
        elif len(lv.generated) >= lv.request.max_new_tokens:
            lv.done, lv.result.finish_reason = True, "length"

    def _draft_chains(self, running: list[_Live], prompt: int) -> _Drafts:
        """A proposal of k tokens for every running request that may still draft, each cut to the
        length its schedule admits (`prompt`: the prompt tokens the step's forward feeds too)."""
        context = self._context(running)
        # row -> its drafts from its prediction or its own tokens
        predicted, looked_up = self._copied(running, context, prompt)
        rest = [i for i in range(len(running)) if i not in predicted]  # the drafter's rows
        k, admitted, expected = self._draft_plan([running[i] for i in rest], context, prompt) if rest \
            else (0, [], None)
        budgets = [0] * len(running)
        for j in admitted:
            budgets[rest[j]] = min(k, max(running[rest[j]].budget, 0))
        drafting = [i for i, b in enumerate(budgets) if b > 0]
        device = self.target.device
        width = max([k, *map(len, predicted.values())])
        fed = torch.zeros(len(running), width + 1, dtype=torch.long, device=device)  # [R, W+1]
        if running:
            fed[:, 0] = torch.tensor([lv.generated[-1] for lv in running], device=device)
        plan = _Drafts(k, fed, [0] * len(running), drafting, expected=expected, looked_up=looked_up)
        for i, drafts in predicted.items():
            fed[i, 1 : len(drafts) + 1] = torch.tensor(drafts, device=device)
            plan.lengths[i] = len(drafts)
        if drafting:
            rows = [running[i] for i in drafting]
            proposal = self.drafter.propose([_draft_row(lv) for lv in rows], k)
            for lv in rows:  # guided drafts were taken by each guide's matcher: back to the committed
                if lv.grammar is not None:
                    lv.grammar.end_drafts()
            plain_rows = len(running) - len(drafting)
            cut = self._verify_lengths(proposal, [budgets[i] for i in drafting], k, plain_rows, context,
                                       prompt)
            for i, n in zip(drafting, cut, strict=True):
                plan.lengths[i] = n
            if proposal.confidence is not None:  # Algorithm 1 cut the block the plan expected gains of:
                plan.expected = None  # the verdicts are held against what the rows verified
            idx = torch.tensor(drafting, device=device)
            fed[idx, 1 : k + 1] = proposal.tokens.to(device)
            if proposal.q_probs is not None:
                plan.q = torch.zeros(len(running), width, proposal.q_probs.shape[-1], device=device)
                plan.q[idx, :k] = proposal.q_probs.to(device)
            self.offered_drafts += sum(budgets[i] for i in drafting)
            self.admitted_drafts += sum(cut)
        sampled = [i for i in predicted if not running[i].request.sampling.greedy]
        if sampled:  # a predicted draft is a point mass: q(x) = 1
            if plan.q is None:
                plan.q = torch.zeros(len(running), width, self.target.vocab_size, device=device)
            for i in sampled:
                n = plan.lengths[i]
                plan.q[i, :n].scatter_(-1, fed[i, 1 : n + 1, None], 1.0)
        # what the drafter's statistics see: a copied row offered none of its drafts
        plan.depths = [0 if i in predicted else n for i, n in enumerate(plan.lengths)]
        return plan

    def _copied(self, running: list[_Live], context: int,
                prompt: int) -> tuple[dict[int, list[int]], set[int]]:
        """The rows (indices into `running`) that draft copied tokens this step, with their drafts:
        those whose prediction continues the answer so far (`spec.prediction`), then those whose own
        tokens repeat their last ones somewhere (`spec.lookup`; adaptive with a cost model: the rows and
        length `spec.cost.admit_rows` finds paying, as it does for the drafter); and which of them are
        the latter."""
        out, copies = self._predicted(running), {}
        for i, lv in enumerate(running):
            if lv.lookup is not None and i not in out:  # it takes the answer's new tokens as it goes
                drafts = lv.lookup.next(lv.generated, min(self.lookup.num_draft_tokens, lv.budget), self.pool)
                if drafts and lv.grammar is not None:
                    drafts = lv.grammar.allowed_prefix(drafts)
                if drafts:
                    copies[i] = drafts
        self.offered_drafts += sum(map(len, copies.values()))
        if copies and self.cost is not None and self.schedule.mode == "adaptive":
            # the rows and the common length that pay, as for the drafter's rows; a row's survival is
            # that of copies whose place matched as many tokens
            survivals = [self._lookup_tracker(running[i].lookup).survival(len(copies[i]))
                         if i in copies else [] for i in range(len(running))]
            k, rows = admit_rows(self.cost, survivals, self.lookup.num_draft_tokens, self.schedule.min_gain,
                                 context, prompt=prompt, copies=True)
            copies = {i: copies[i][:k] for i in rows}
        self.admitted_drafts += sum(map(len, copies.values()))
        out.update(copies)
        return out, set(copies)

    def _predicted(self, running: list[_Live]) -> dict[int, list[int]]:
        """The rows (indices into `running`) whose prediction continues the answer so far, with the
        drafts it gives them (`spec.prediction`; chains and trees alike)."""
        out = {}
        for i, lv in enumerate(running):
            if lv.prediction is not None:
                drafts = lv.prediction.next(lv.generated, min(PREDICTION_DRAFTS, lv.budget))
                if drafts:
                    out[i] = drafts
        return out

    def _lookup_tracker(self, lookup: PromptLookup) -> AcceptanceTracker:
        """The acceptance of copies like `lookup`'s last: from the same source, matching as many."""
        return self.lookup_acceptance[lookup.pooled, lookup.match]

    def _draft_trees(self, running: list[_Live], prompt: int) -> _Drafts:
        """A draft tree for every running request the schedule lets draft (its depth capped by the
        request's remaining budget), a chain for each whose prediction continues its answer (a tree
        of one branch; its drafts point masses, as every node of a top-k tree is); the others feed
        their last token alone."""
        depth = self.drafter.tree_depth(self.tree)
        predicted = self._predicted(running)
        drafting = self._tree_rows(running, depth, prompt, skip=set(predicted))
        device = self.target.device
        r = len(running)
        last = torch.tensor([lv.generated[-1] for lv in running], dtype=torch.long, device=device)
        if not drafting and not predicted:
            tree = DraftTree(torch.zeros(r, 0, dtype=torch.long, device=device),
                             torch.zeros(r, 0, dtype=torch.long, device=device), [0] * r)
            return _Drafts(0, last[:, None], [0] * r, [], tree=tree, depths=[0] * r)
        drafted = None
        if drafting:
            rows = [running[i] for i in drafting]
            drafted = self.drafter.propose_tree([_draft_row(lv) for lv in rows], self.tree)
            drafted = drafted.truncated([min(depth, lv.budget) for lv in rows])
        n = max([*(drafted.sizes if drafted else []), *map(len, predicted.values())])
        tokens = torch.zeros(r, n, dtype=torch.long, device=device)  # [R, N]
        parents = torch.zeros(r, n, dtype=torch.long, device=device)  # [R, N]
        node_depths = torch.zeros(r, n + 1, dtype=torch.long, device=device)  # [R, N+1]
        sizes = [0] * r
        if drafted is not None:
            width = max(drafted.sizes)
            idx = torch.tensor(drafting, device=device)
            tokens[idx, :width] = drafted.tokens[:, :width].to(device)
            parents[idx, :width] = drafted.parents[:, :width].to(device)
            node_depths[idx, : width + 1] = drafted.depths()[:, : width + 1].to(device)
            for i, size in zip(drafting, drafted.sizes, strict=True):
                sizes[i] = size
        for i, drafts in predicted.items():  # node j + 1 is drafts[j], its parent node j
            m = len(drafts)
            tokens[i, :m] = torch.tensor(drafts, device=device)
            parents[i, :m] = torch.arange(m, device=device)
            node_depths[i, : m + 1] = torch.arange(m + 1, device=device)
            sizes[i] = m
        padding = torch.arange(n + 1, device=device)[None, :] > torch.tensor(sizes, device=device)[:, None]
        tree = DraftTree(tokens, parents, sizes, node_depths=node_depths.masked_fill(padding, 0))
        depths = tree.node_depths.amax(-1).tolist()
        drafter_nodes = sum(sizes[i] for i in drafting)
        self.offered_drafts += drafter_nodes
        self.admitted_drafts += drafter_nodes
        # what the drafter's statistics see, k included (as chains count it): a predicted row offered
        # none of its drafts
        offered = [0 if i in predicted else d for i, d in enumerate(depths)]
        return _Drafts(max(offered), torch.cat([last[:, None], tokens], 1), sizes, drafting, tree=tree,
                       depths=offered)

    def _tree_rows(self, running: list[_Live], depth: int, prompt: int, skip: set[int]) -> list[int]:
        """Rows that draft a tree this step: every row with budget left (schedule full), or those the
        cost model admits (adaptive, `spec.cost.tree_rows`: from acceptance history only, the step
        priced at its context and with each request's catch-up, as chains are); never those in
        `skip` (they draft from their prediction)."""
        may = [i for i, lv in enumerate(running) if lv.budget > 0 and i not in skip]
        if self.schedule.mode != "adaptive" or not may:
            return may
        from trtspec.spec.cost import tree_rows

        scale = self.calibration.scale
        tokens = [1.0 + sum(scale(lv.acceptance.survival(min(depth, max(lv.budget, 0))))) for lv in running]
        one_pass = self.drafter.method in ("dflash", "dspark")
        seconds = self._catch_up_seconds(running, self._catch_ups(running), tokens)
        chosen = tree_rows(self.cost_table, [tokens[i] for i in may], len(running), self.tree.nodes, depth,
                           per_depth_forward=not one_pass, topk=self.tree.topk,
                           min_gain=self.schedule.min_gain, context=self._context(running),
                           catch_up=[seconds[i] for i in may], prompt=prompt)
        if self._probe(drafting=bool(chosen)):
            return may
        return [may[j] for j in chosen]

    def _calibrate(self, plan: _Drafts, running: list[_Live], accepted: list[int]) -> None:
        """Hold a step's accepted drafts against what the estimates expected (before they observe it)."""
        offered = [(lv, d, a) for lv, d, a in zip(running, plan.depths, accepted, strict=True) if d]
        expected = plan.expected
        if expected is None:  # a probe, or a tree: what the history expected of what was verified
            expected = sum(sum(lv.acceptance.survival(d)) for lv, d, _ in offered)
        if expected:
            self.calibration.observe(expected, sum(a for _, _, a in offered))

    def _prefill_pieces(self, prefilling: list[_Live]) -> list[tuple[_Live, int, int]]:
        """The prompt pieces (request, start, end) this step feeds, in arrival order: each new
        request's next piece, together at most `prefill_chunk` tokens (chunked prefill, as vLLM's
        and TensorRT-LLM's schedulers do it: a long prompt fed whole stalls every running request
        for its whole length, 2.3 s at 3,900 tokens of the embedded target against 10-25 ms steps),
        and a piece of at most `prompt_logprobs_chunk` tokens where the prompt's log-probabilities
        are asked (no forward scores more). A request whose piece ends its prompt gets its first
        token from this step's forward; the others continue in the next step."""
        budget = self.prefill_chunk
        pieces = []
        for lv in prefilling:
            start, prompt = lv.prefill.fed, lv.request.prompt
            n = len(prompt) - start
            if lv.request.prompt_logprobs is not None:
                n = min(n, self.prompt_logprobs_chunk)
            if budget is not None:
                n = min(n, budget)
                budget -= n
            if n <= 0:
                break
            pieces.append((lv, start, start + n))
        return pieces

    @torch.inference_mode()
    def step(self) -> dict[int, GenerationResult]:
        """One drafter pass, one target forward and one verification for every request; returns the
        requests that finished."""
        if not self.lives:
            return {}
        target, drafter, device = self.target, self.drafter, self.target.device
        prefilling = [lv for lv in self.lives.values() if lv.prefill is not None]  # in arrival order
        running = [lv for lv in self.lives.values() if lv.prefill is None]

        # 1. draft: a chain of k tokens (or a tree) for every running request that may still draft,
        # priced with the prompt pieces the same forward feeds (a step that also prefills costs more
        # whatever k is, so drafting pays more easily in it)
        pieces = self._prefill_pieces(prefilling)
        prompt = sum(end - start for _, start, end in pieces)
        t_draft = time.perf_counter()
        draft = self._draft_chains if self.tree is None else self._draft_trees
        plan = draft(running, prompt)
        spent = time.perf_counter() - t_draft
        for i in plan.drafting:
            running[i].result.draft_s += spent
        if running:
            self.draft_len_counts[plan.k] = self.draft_len_counts.get(plan.k, 0) + 1

        # 2. ONE target forward: the new prompts' pieces (`_prefill_pieces`), then each running
        # [last, x_1..x_L] (a tree: its nodes)
        chunks = [Chunk(lv.slot, torch.tensor(lv.request.prompt[a:b], device=device)) for lv, a, b in pieces]
        for i, lv in enumerate(running):
            parents = None if plan.tree is None else plan.tree.row_parents(i)
            chunks.append(Chunk(lv.slot, plan.fed[i, : plan.lengths[i] + 1], parents))
        tree_starts = [target.seq_len(lv.slot) for lv in running]
        starts = [0]
        for c in chunks:
            starts.append(starts[-1] + len(c.input_ids))
        # the logits kept: a piece's positions that predict its prompt's next tokens when they are
        # asked, and the last prompt token's (which predicts the first generated one)
        keep, scored_at, first_at, new = [], {}, [], []
        for i, (lv, _, end) in enumerate(pieces):
            last = end == len(lv.request.prompt)
            if lv.request.prompt_logprobs is not None:
                scored_at[i] = len(keep)
                keep += range(starts[i], starts[i + 1] - last)
            if last:
                new.append(lv)
                first_at.append(len(keep))
                keep.append(starts[i + 1] - 1)
        new_logits = len(keep)  # the running rows' logits come after these
        for i in range(len(running)):
            keep += range(starts[len(pieces) + i], starts[len(pieces) + i + 1])
        masks = self._fill_masks(running, plan) if running else None  # beside the forward
        try:
            out = target.forward(chunks, torch.tensor(keep or [0], device=device))
        except BaseException:
            for filling in (masks or {}).values():  # no fill outlives the step on its matcher
                filling.cancel() or filling.exception()
            raise
        self.num_steps += 1
        now = time.perf_counter()

        # 3a. new requests: their pieces' taps and prompt log-probabilities, and once the prompt is
        # all in, their first token
        for i, (lv, start, end) in enumerate(pieces):
            lv.result.num_target_calls += 1
            if out.hidden is not None:
                lv.prefill.hidden.append(out.hidden[starts[i] : starts[i + 1]])  # [n, D]
            if i in scored_at:  # positions start..end-1 predict the prompt's tokens start+1..end
                scored = end - start - (end == len(lv.request.prompt))
                at = scored_at[i]
                lv.prefill.logprobs.extend(prompt_logprobs(out.logits[at : at + scored],
                                                           lv.request.prompt[start : start + scored + 1],
                                                           lv.request.prompt_logprobs))
            lv.prefill.fed = end
        if new:
            first_logits = out.logits[first_at]  # [N, V]
            raw = self._wanting_logprobs(first_logits[:, None], new)  # before the min_tokens ban
            self._along_paths(first_logits[:, None], new)
            self._ban_end(first_logits[:, None], new)
            dead_first = self._dead_ends(first_logits[:, None], new)
            first, _ = choose_tokens(first_logits, [lv.request.sampling for lv in new],
                                     [lv.generator for lv in new], [len(lv.request.prompt) for lv in new])
            first = first.tolist()
            logprobs = self._logprobs(raw, new, [[0]] * len(new), [[t] for t in first])
            for i, (lv, token) in enumerate(zip(new, first, strict=True)):
                prefill, lv.prefill = lv.prefill, None
                hidden = torch.cat(prefill.hidden) if prefill.hidden else None  # [P, D]
                drafter.begin(lv.slot, lv.request.prompt, hidden, prefill.reused)
                lv.result.prompt_logprobs = prefill.logprobs
                lv.result.prefill_s = now - lv.added_at
                if i in dead_first:
                    self._dead_end(lv)
                else:
                    self._emit(lv, [token], logprobs.get(i))

        # 3b. running requests: verify every row at once, keep each slot's accepted path, emit
        if running:
            self.num_cycles += 1
            lengths = plan.lengths
            width = max(lengths)
            logit_starts = [new_logits]
            for n in lengths:
                logit_starts.append(logit_starts[-1] + n + 1)
            rows_at = torch.tensor([[logit_starts[i] + min(j, lengths[i]) for j in range(width + 1)]
                                   for i in range(len(running))], device=device)  # [R, width+1]
            logits = out.logits[rows_at]  # [R, width+1, V]
            raw = self._wanting_logprobs(logits, running)  # before the min_tokens ban
            params, generators = [lv.request.sampling for lv in running], [lv.generator for lv in running]
            # the position each row's logits row 0 predicts (Gumbel-coupled rows key their noise by it)
            positions = [len(lv.committed) for lv in running]
            if plan.tree is None:
                self._along_paths(logits, running, plan.fed, masks=masks)
                self._ban_end(logits, running)
                dead = self._dead_ends(logits, running)
                q = None if plan.q is None else plan.q[:, :width]
                lens = torch.tensor(lengths, device=device)
                drafts = plan.fed[:, 1 : width + 1]
                verdict = self.verifier.verify(drafts, lens, q, logits, params, generators, positions)
                accepted = verdict.num_accepted.tolist()  # the step's one host sync
                paths = [list(range(a + 1)) for a in accepted]
            else:
                self._along_paths(logits, running, plan.fed, plan.tree, masks)
                self._ban_end(logits, running, plan.tree)
                dead = self._dead_ends(logits, running)
                verdict = self.verifier.verify_tree(plan.tree, logits, params, generators, positions)
                accepted = verdict.num_accepted.tolist()  # the step's one host sync
                paths = [[0] + p[:a] for p, a in zip(verdict.path.tolist(), accepted, strict=True)]
                target.keep_paths([PathKeep(lv.slot, start, path)
                                   for lv, start, path in zip(running, tree_starts, paths, strict=True)])
            tokens = verdict.tokens.tolist()
            emitted = [row[: a + 1] for row, a in zip(tokens, accepted, strict=True)]
            logprobs = self._logprobs(raw, running, paths, emitted)
            if self.schedule.mode == "adaptive":  # only adaptive reads the calibration
                self._calibrate(plan, running, accepted)
            for i, lv in enumerate(running):
                n, a, depth = lengths[i], accepted[i], plan.depths[i]
                if plan.tree is None:
                    target.rewind(lv.slot, n - a)
                hidden = None
                if out.hidden is not None:
                    base = starts[len(pieces) + i]
                    hidden = out.hidden[base : base + a + 1] if plan.tree is None else \
                        out.hidden[torch.tensor(paths[i], device=device) + base]
                drafter.commit(lv.slot, a, hidden)
                looked_up = i in plan.looked_up  # drafts of the deployment's, not the drafter's
                lv.result.record_cycle(num_drafted=n if looked_up else depth,
                                       num_accepted=a if depth or looked_up else 0)
                if looked_up:
                    lv.result.num_looked_up += n
                    lv.result.num_lookup_accepted += a
                    if lv.lookup.pooled:
                        lv.result.num_pooled += n
                        lv.result.num_pool_accepted += a
                    self._lookup_tracker(lv.lookup).observe(n, a)
                elif n and not depth:  # its prediction's drafts: counted apart from the drafter's
                    lv.result.num_predicted += n
                    lv.result.num_prediction_accepted += a
                lv.result.num_target_calls += 1
                if depth:
                    lv.acceptance.observe(depth, a)
                    self.population.observe(depth, a)
                if any(at in dead.get(i, ()) for at in paths[i]):  # its path reached a dead end
                    self._dead_end(lv)
                else:
                    self._emit(lv, emitted[i], logprobs.get(i))

        finished, done = {}, []
        for rid in [rid for rid, lv in self.lives.items() if lv.done]:
            lv = self.lives.pop(rid)
            lv.result.total_s = time.perf_counter() - lv.added_at
            lv.result.token_ids = lv.generated
            lv.result.logprobs = lv.logprobs
            done.append(lv)
            finished[rid] = lv.result
            if self.pool is not None and lv.result.error is None:
                self.pool.add(lv.committed, lv.request.cache_salt)
        self._free(done)
        drafter.tidy()
        return finished

    # -- whole generations ------------------------------------------------------------------

    def generate(self, prompt: list[int], max_new_tokens: int, sampling: SamplingParams | None = None,
                 on_tokens: OnTokens | None = None, guide: object | None = None) -> GenerationResult:
        """Decode one request alone (R = 1 of the same loop). `on_tokens` (streaming) is called with
        the ids each step emits, the first token included; returning True ends generation there.
        `guide`: a compiled guide the text must match (`Request.guide`)."""
        if not prompt:
            raise ValueError("prompt is empty: give at least one token")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.reset()
        rid = self.add(Request(prompt, max_new_tokens, sampling or SamplingParams(), guide=guide), on_tokens)
        done: dict[int, GenerationResult] = {}
        while self.lives:
            done.update(self.step())
        if done[rid].error is not None:
            raise ValueError(done[rid].error)
        return done[rid]

    def generate_batch(self, requests: list[Request]) -> list[GenerationResult]:
        """Serve `requests` together from empty slots until all are done (at most `max_slots` run at
        once; the rest join as slots free up)."""
        self.reset()
        for i, req in enumerate(requests):
            try:
                self.check(req)
            except ValueError as exc:
                raise ValueError(f"request {i}: {exc}") from None
        waiting = list(enumerate(requests))
        ids: dict[int, int] = {}
        results: dict[int, GenerationResult] = {}
        while waiting or self.lives:
            while waiting and len(self.lives) < self.max_slots:
                i, req = waiting.pop(0)
                ids[i] = self.add(req)
            results.update(self.step())
        failed = next((i for i in range(len(requests)) if results[ids[i]].error is not None), None)
        if failed is not None:
            raise ValueError(f"request {failed}: {results[ids[failed]].error}")
        return [results[ids[i]] for i in range(len(requests))]
