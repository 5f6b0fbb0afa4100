"""The decoupled orchestration model: Triton's Python backend runs this, one instance per slot.

Imported by the generated `<repo>/<name>/1/model.py` inside the backend's stub process, where
`triton_python_backend_utils` exists. It serves the build config copied beside the model
(`build_config.yaml`) with continuous batching: `execute` only parses each request and queues it;
one loop thread admits queued requests (up to `limits.max_concurrency`) into the serving loop
(`SpeculativeDecoder`) and steps it: ONE drafter pass, ONE packed target forward (new prompts are
prefilled in the same forward) and ONE verification per step for every running request, with the
config's schedule (adaptive by default: speculation turns itself down as the batch grows).
Requests leave when done, stopped or cancelled; the rest keep going. Their responses are built and
sent by a thread of their own (`trtspec.triton.outbox`), in order, while the loop steps on.

Responses. `stream` false: one response with the whole `text_output`, `output_ids`,
`accepted_tokens`, `draft_tokens`, `target_forwards`, `cached_tokens`. `stream` true: one response
per decode step with the new `text_output` / `output_ids` (every `limits.stream_interval` steps, with
those steps' output; the first step's at once), then a last one with the request's
`accepted_tokens` / `draft_tokens` / `target_forwards` / `cached_tokens` totals (and any text held
back); `cached_tokens`: the prompt tokens kept from an earlier request (`limits.prefix_reuse`),
in a stream's first response too (known before its text, as Anthropic's message_start reports it).
The totals come with `finish_reason`: `stop` (an end or stop id, or a stop word) or `length`
(`max_tokens`). A sampled request's totals come with `sampling_seed`: its `random_seed`, or the
seed drawn for it when it sent none (sent back as `random_seed`, it samples the same text again:
always under Gumbel coupling, under the same schedule by rejection sampling). With
`return_log_probs` (or `num_top_log_probs`) every response that carries generated ids also carries
`output_log_probs` (one per generated id), `cum_log_probs` (their sum so far) and, for k > 0,
`top_log_probs` / `top_log_prob_ids` [n, k]. With `return_prompt_log_probs` the first response
carries the prompt's: `prompt_log_probs` for its tokens after the first (and
`prompt_top_log_probs` / `prompt_top_log_prob_ids`). Any bad parameter gets one error response
naming it.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.config import load_build_config
from trtspec.errors import GENERATION_FAILED, SERVER_BUSY, SHUTTING_DOWN
from trtspec.pipeline import load_pipeline
from trtspec.runtime import configure_threads
from trtspec.spec.decoder import Emitted, PromptError, Request
from trtspec.spec.grammar import GuideError
from trtspec.spec.logprobs import TokenLogprobs
from trtspec.spec.metrics import GenerationResult
from trtspec.triton.outbox import Outbox
from trtspec.triton.repo import BUILD_CONFIG_FILE, instances_on_this_machine, placed_on_instance
from trtspec.triton.request import (
    GenerateRequest,
    RequestError,
    TextStream,
    context_of,
    parameters_not_utf8,
    parse_request,
    tokenized,
)
from trtspec.triton.server import STOP_FILE_ENV

log = logging.getLogger(__name__)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TAU_BUCKETS = [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0]
SECONDS_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
ERROR_REASONS = ("invalid_request", "generation_failed", "server_busy")
# Every metric update and every cancellation question crosses from this stub to Triton's process
# (0.1-0.2 ms each on a 2-core CPU; a response costs 0.25 and goes through the `Outbox`, off the
# loop's thread). Once per step they added about 0.4 ms to a 10-14 ms step, so the loop sends the
# gauges only when they change, the step counter at most every STEPS_FLUSH_S (and whenever a
# request ends or the loop idles), and a streaming request asks whether its client is still there
# at most every CANCEL_POLL_S.
STEPS_FLUSH_S = 0.25
CANCEL_POLL_S = 0.05
# how often the loop asks whether the clients of queued requests are still there: a cancelled one
# leaves the queue then, instead of being counted as waiting until a slot frees (6 clients gone
# behind 8 slots decoding 2,000 tokens each still showed as 6 waiting 2.5 s later); one question
# per queued request per sweep
WAITING_POLL_S = 0.5


class Metrics:
    """Acceptance, load and latency on Triton's metrics port (Prometheus), labelled by model.

    Names are what deploy/grafana and deploy/prometheus query (tests/test_monitoring.py checks each
    expression against this server). Queue and first-token times start when `execute` queues the
    request: a decoupled Python model returns from `execute` at once, so Triton's own
    `nv_inference_queue_duration_us` never sees the wait for a decoder slot.
    """

    def __init__(self, model: str, version: str, instance: str):
        labels = {"model": model, "version": version}
        # Triton hands every instance the same series for the same labels: increments add up, but
        # a gauge's `set` would overwrite the other instances' value, so the gauges are per instance
        gauge_labels = {**labels, "model_instance": instance}
        counter, gauge, hist = (pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE,
                                pb_utils.MetricFamily.HISTOGRAM)
        family = pb_utils.MetricFamily
        requests = family("trtspec_requests_total", "Requests completed", counter)
        generated = family("trtspec_generated_tokens_total", "Tokens generated", counter)
        accepted = family("trtspec_accepted_tokens_total", "Draft tokens accepted", counter)
        drafted = family("trtspec_draft_tokens_total", "Draft tokens proposed", counter)
        forwards = family("trtspec_target_forwards_total", "Target forward passes", counter)
        prompts = family("trtspec_prompt_tokens_total", "Prompt tokens of completed requests", counter)
        cached = family("trtspec_cached_prompt_tokens_total",
                        "Prompt tokens kept from an earlier request's K/V (prefix reuse), not prefilled",
                        counter)
        tau = family("trtspec_tau", "Tokens per target forward, per request (tau)", hist)
        steps = family("trtspec_batch_steps_total",
                       "Packed target forwards of the instance (one per step for all requests)", counter)
        queue = family("trtspec_queue_seconds", "Seconds from arrival to a decoder slot, per request", hist)
        ttft = family("trtspec_time_to_first_token_seconds",
                      "Seconds from arrival to the first generated token, per request", hist)
        in_flight = family("trtspec_requests_in_flight", "Requests decoding in the instance now", gauge)
        waiting = family("trtspec_requests_waiting", "Requests queued for a decoder slot now", gauge)
        # drafts copied, by source: the request's prediction (not in the two above), its own tokens by
        # prompt lookup and the lookup pool's (other requests' tokens; both in them too)
        copied = family("trtspec_copied_draft_tokens_total",
                        "Draft tokens copied from the request's prediction, its own tokens or other "
                        "requests' (the lookup pool), by source", counter)
        copied_accepted = family("trtspec_copied_accepted_tokens_total",
                                 "Copied draft tokens accepted, by source (prediction, lookup, pool)",
                                 counter)
        errors = family("trtspec_request_errors_total",
                        "Requests answered with an error, by reason (invalid_request, generation_failed, "
                        "server_busy)",
                        counter)
        self._families = [requests, generated, accepted, drafted, forwards, prompts, cached, tau, steps,
                          queue, ttft, in_flight, waiting, errors, copied, copied_accepted]
        self.requests = requests.Metric(labels=labels)
        self.generated = generated.Metric(labels=labels)
        self.accepted = accepted.Metric(labels=labels)
        self.drafted = drafted.Metric(labels=labels)
        self.forwards = forwards.Metric(labels=labels)
        self.prompt_tokens = prompts.Metric(labels=labels)
        self.cached_tokens = cached.Metric(labels=labels)
        self.tau = tau.Metric(labels=labels, buckets=TAU_BUCKETS)
        self.steps = steps.Metric(labels=labels)
        self.queue = queue.Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self.ttft = ttft.Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self.in_flight = in_flight.Metric(labels=gauge_labels)
        self.waiting = waiting.Metric(labels=gauge_labels)
        self.errors = {reason: errors.Metric(labels={**labels, "reason": reason}) for reason in ERROR_REASONS}
        self.copied = {source: (copied.Metric(labels={**labels, "source": source}),
                                copied_accepted.Metric(labels={**labels, "source": source}))
                       for source in ("prediction", "lookup", "pool")}
        self._load: tuple[int, int] | None = None  # the gauges as last sent
        self._steps = 0  # steps not yet added to the counter
        self._steps_sent_at = time.monotonic()

    def record(self, result: GenerationResult) -> None:
        self.flush_steps()
        self.requests.increment(1)
        self.generated.increment(len(result.token_ids))
        self.accepted.increment(result.num_accepted)
        self.drafted.increment(result.num_drafted)
        self.forwards.increment(result.num_target_calls)
        self.prompt_tokens.increment(result.prompt_len)
        self.cached_tokens.increment(result.cached_tokens)
        self.tau.observe(result.tau)
        for source, drafts, accepted in (("prediction", result.num_predicted, result.num_prediction_accepted),
                                         ("lookup", result.num_looked_up - result.num_pooled,
                                          result.num_lookup_accepted - result.num_pool_accepted),
                                         ("pool", result.num_pooled, result.num_pool_accepted)):
            if drafts:
                self.copied[source][0].increment(drafts)
                self.copied[source][1].increment(accepted)

    def load(self, running: int, waiting: int) -> None:
        if (running, waiting) != self._load:
            self._load = (running, waiting)
            self.in_flight.set(running)
            self.waiting.set(waiting)

    def count_step(self) -> None:
        self._steps += 1
        if time.monotonic() - self._steps_sent_at >= STEPS_FLUSH_S:
            self.flush_steps()

    def flush_steps(self) -> None:
        if self._steps:
            self.steps.increment(self._steps)
            self._steps = 0
        self._steps_sent_at = time.monotonic()


def _tensor(name: str, value) -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.asarray(value))


def _logprob_tensors(prefix: str, values: str, logprobs: TokenLogprobs) -> list[pb_utils.Tensor]:
    """`values` [n], then `{prefix}top_log_probs` / `{prefix}top_log_prob_ids` [n, k] for k > 0."""
    n, k = len(logprobs), logprobs.top
    tensors = [_tensor(values, np.array(logprobs.values, dtype=np.float32))]  # [n]
    if k:
        tensors += [
            _tensor(f"{prefix}top_log_probs", np.array(logprobs.top_values, dtype=np.float32).reshape(n, k)),
            _tensor(f"{prefix}top_log_prob_ids", np.array(logprobs.top_ids, dtype=np.int32).reshape(n, k)),
        ]
    return tensors


def _response(text: str, ids: list[int], totals: GenerationResult | None = None,
              logprobs: TokenLogprobs | None = None, cumulative: float = 0.0,
              prompt_logprobs: TokenLogprobs | None = None, cached: int = 0) -> pb_utils.InferenceResponse:
    """One response; `totals` (the request's result) only in its last: a streamed step's carry zeros,
    but the first carries `cached` (what the prompt kept), known before any text."""
    accepted, drafted, forwards, cached = (0, 0, 0, cached) if totals is None else \
        (totals.num_accepted, totals.num_drafted, totals.num_target_calls, totals.cached_tokens)
    seed, finish_reason = (None, None) if totals is None else (totals.seed, totals.finish_reason)
    predicted, accepted_predicted = (0, 0) if totals is None else \
        (totals.num_predicted, totals.num_prediction_accepted)
    tensors = [
        _tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),  # [1]
        _tensor("output_ids", np.array(ids, dtype=np.int32)),  # [n]
        _tensor("accepted_tokens", np.array([accepted], dtype=np.int32)),  # [1]
        _tensor("draft_tokens", np.array([drafted], dtype=np.int32)),  # [1]
        _tensor("target_forwards", np.array([forwards], dtype=np.int32)),  # [1]
        _tensor("cached_tokens", np.array([cached], dtype=np.int32)),  # [1]
    ]
    if predicted:
        tensors += [_tensor("prediction_tokens", np.array([predicted], dtype=np.int32)),  # [1]
                    _tensor("accepted_prediction_tokens", np.array([accepted_predicted], dtype=np.int32))]
    if seed is not None:
        tensors.append(_tensor("sampling_seed", np.array([seed], dtype=np.uint64)))  # [1]
    if finish_reason is not None:
        tensors.append(_tensor("finish_reason", np.array([finish_reason.encode()], dtype=np.object_)))  # [1]
    if logprobs is not None:
        tensors += _logprob_tensors("", "output_log_probs", logprobs)
        tensors.append(_tensor("cum_log_probs", np.array([cumulative], dtype=np.float32)))  # [1]
    if prompt_logprobs is not None:
        tensors += _logprob_tensors("prompt_", "prompt_log_probs", prompt_logprobs)
    return pb_utils.InferenceResponse(output_tensors=tensors)


def _error(message: str, bad_request: bool = True, unavailable: bool = False) -> pb_utils.InferenceResponse:
    """An error response: INVALID_ARG for a bad request (HTTP 400), UNAVAILABLE where the server
    cannot take or finish it now (503), else INTERNAL (500). The backend binds TritonError into
    pb_utils only after this module is imported."""
    error = pb_utils.TritonError
    code = error.UNAVAILABLE if unavailable else error.INVALID_ARG if bad_request else error.INTERNAL
    return pb_utils.InferenceResponse(error=error(message, code))


def _parameters(request) -> dict:
    try:
        raw = request.parameters()
    except UnicodeDecodeError as exc:  # their JSON comes decoded from UTF-8: some text in it is not
        raise RequestError(parameters_not_utf8(exc.object)) from None
    return json.loads(raw) if raw else {}


class _Places:
    """The places of the requests an instance holds, decoding or waiting for a slot: one taken by
    `execute` as it queues a request, given back by the request's final response. limits.max_queued
    bounds how many may wait beyond the decoder's slots (None: no bound)."""

    def __init__(self, slots: int, max_queued: int | None):
        self.slots, self.max_queued = slots, max_queued
        self.count = 0
        self._lock = threading.Lock()  # `execute` takes (Triton's threads), the loop thread gives back

    def take(self) -> str | None:
        """Hold one more request; or why not (the server is busy)."""
        with self._lock:
            if self.max_queued is None or self.count < self.slots + self.max_queued:
                self.count += 1
                return None
        return (f"{SERVER_BUSY}its {self.slots} decoder slots are taken and {self.max_queued} requests wait "
                f"already (limits.max_queued {self.max_queued}); retry later")

    def give_back(self) -> None:
        with self._lock:
            self.count -= 1


@dataclass
class _Stream:
    """One request on its way: its parameters, where its responses go, its text so far."""

    request: GenerateRequest
    sender: object
    outbox: Outbox  # where its responses leave the loop, in order
    text: TextStream
    metrics: Metrics
    decode: Request  # what the decoder runs: the tokenized prompt and limits
    prompt_ids: list[int] | None = None  # owed at the front of the output (exclude_input_in_output false)
    logprobs: TokenLogprobs | None = None  # of the ids kept so far, when the request asked for them
    prompt_logprobs: TokenLogprobs | None = None  # the prompt's, when asked, until sent
    queued_at: float = field(default_factory=time.monotonic)
    got_first_token: bool = False
    polled_at: float = float("-inf")  # when `cancelled` last asked Triton
    was_cancelled: bool = False  # for good: a cancellation, or a response that could not be sent
    responses: int = 0  # sent or queued so far
    interval: int = 1  # decode steps per streamed response (limits.stream_interval)
    steps: int = 0  # decode steps that gave it tokens so far
    held: tuple[str, list[int], TokenLogprobs | None] = ("", [], None)  # output not yet streamed
    place: _Places | None = None  # the instance's count that holds it, until its final response
    cached: int = 0  # prompt tokens kept from a slot (prefix reuse): sent with the first response

    def cancelled(self) -> bool:
        """Whether the client cancelled or went away, asked of Triton at most every CANCEL_POLL_S."""
        now = time.monotonic()
        if not self.was_cancelled and now - self.polled_at >= CANCEL_POLL_S:
            self.polled_at, self.was_cancelled = now, self.sender.is_cancelled()
        return self.was_cancelled

    def went_away(self) -> None:
        """The outbox's word that a response of this request could not be sent."""
        self.was_cancelled = True

    def send(self, build: functools.partial | None, flags: int = 0) -> None:
        """Queue a response (`build()` makes it on the outbox's thread); the first goes at once."""
        self.outbox.send(self.sender, build, flags, self.went_away, at_once=self.responses == 0)
        self.responses += 1
        if flags & FINAL and self.place is not None:  # its place is free for the next request
            self.place.give_back()
            self.place = None

    def _with_prompt(self, text: str, ids: list[int]) -> tuple[str, list[int]]:
        if self.prompt_ids is None:
            return text, ids
        prompt_ids, self.prompt_ids = self.prompt_ids, None
        given = self.request.prompt if self.request.prompt_ids is None else self.text.decode(prompt_ids)
        return given + text, prompt_ids + ids

    def on_tokens(self, emitted: Emitted) -> bool:
        """The decoder's callback: stream the new text; True ends the request."""
        if emitted.ids:
            self.steps += 1
            if not self.got_first_token:
                self.got_first_token = True
                self.metrics.ttft.observe(time.monotonic() - self.queued_at)
        if emitted.prompt_logprobs is not None:
            self.prompt_logprobs = emitted.prompt_logprobs
        self.cached = max(self.cached, emitted.cached_tokens)
        delta, kept = self.text.push(emitted.ids)
        logprobs = emitted.logprobs
        if logprobs is not None:  # a stop word may end the output before the step's last id
            logprobs = logprobs.head(len(kept))
            self.logprobs.extend(logprobs)
        if self.request.stream and (delta or kept):
            if self.cancelled():
                return True  # the client is gone: free its slot
            self._hold(delta, kept, logprobs)
            # TensorRT-LLM's rule: the first output at once (time to first token), then every
            # interval-th step's with what the steps between held
            if self.responses == 0 or self.steps % self.interval == 0:
                text, ids, logprobs = self._take_held()
                cumulative = 0.0 if logprobs is None else self.logprobs.cumulative()
                prompt, self.prompt_logprobs = self.prompt_logprobs, None  # with the first response
                cached = self.cached if self.responses == 0 else 0
                self.send(functools.partial(_response, text, ids, None, logprobs, cumulative, prompt, cached))
            return self.text.stopped
        return self.text.stopped or self.cancelled()

    def _hold(self, text: str, ids: list[int], logprobs: TokenLogprobs | None) -> None:
        """Keep a step's new output until the response that streams it."""
        held_text, held_ids, held_logprobs = self.held
        if logprobs is not None:
            held_logprobs = TokenLogprobs(logprobs.top) if held_logprobs is None else held_logprobs
            held_logprobs.extend(logprobs)
        self.held = (held_text + text, held_ids + ids, held_logprobs)

    def _take_held(self) -> tuple[str, list[int], TokenLogprobs | None]:
        """The output held since the last streamed response (the prompt's in front when owed)."""
        (text, ids, logprobs), self.held = self.held, ("", [], None)
        return *self._with_prompt(text, ids), logprobs

    def finish(self, result: GenerationResult) -> None:
        if result.error is not None:  # the request could not go on: its parameters left no token
            self.send(functools.partial(_error, result.error), FINAL)
            return
        if self.request.stream:  # what no response streamed yet: steps' output held, text held back
            self._hold(self.text.finish(), [], None)
            text, ids, logprobs = self._take_held()
        else:
            text, ids = self._with_prompt(self.text.text, self.text.ids)
            logprobs = self.logprobs
        cumulative = 0.0 if logprobs is None else self.logprobs.cumulative()
        build = functools.partial(_response, text, ids, result, logprobs, cumulative, self.prompt_logprobs)
        self.send(build, FINAL)


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_dir = Path(args["model_repository"])
        config = load_build_config(model_dir / args["model_version"] / BUILD_CONFIG_FILE)
        kind, device_id = args["model_instance_kind"], args["model_instance_device_id"]
        self.config = placed_on_instance(config, kind, device_id)  # a GPU instance: on its own GPU
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(
                f"{model_dir / 'config.pbtxt'}: the model must be decoupled (model_transaction_policy "
                "{ decoupled: true }); build it again with `trtspec build`")
        configure_threads(self.config, instances_on_this_machine(model_config))
        self.pipeline = load_pipeline(self.config)
        self.decoder = self.pipeline.batch_decoder()
        self.limit = self.config.limits.max_tokens
        self.metrics = Metrics(args["model_name"], args["model_version"], args["model_instance_name"])
        self.outbox = Outbox(FINAL)  # the loop's responses, sent beside its steps
        self.waiting: queue.Queue[_Stream] = queue.Queue()  # from `execute` to the loop thread
        self.queued: deque[_Stream] = deque()  # the loop thread's, in arrival order
        self.places = _Places(self.config.limits.max_concurrency, self.config.limits.max_queued)
        self._swept_at = time.monotonic()  # when `_drop_cancelled` last asked
        stop_file = os.environ.get(STOP_FILE_ENV)  # set by trtspec's TritonServer
        self._stop_file = Path(stop_file) if stop_file else None
        self._stop_checked_at = time.monotonic()
        # test_only.fail_on_max_tokens, read once (`_planted_failure` runs before every step)
        self._planted_max_tokens = self.config.test_only.fail_on_max_tokens if self.config.test_only else None
        self.stopping = threading.Event()
        self.loop = threading.Thread(target=self._serve, name="trtspec-batch", daemon=True)
        self.loop.start()
        log.info("%s ready on %s %s, up to %d requests per step", args["model_instance_name"],
                 args["model_instance_kind"], args["model_instance_device_id"],
                 self.config.limits.max_concurrency)

    def execute(self, requests) -> None:
        """Parse and queue; the loop thread answers (decoupled: responses come later)."""
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_request(lambda name, r=request: _input(r, name), self.limit,
                                       _parameters(request), self.pipeline.target.vocab_size,
                                       self.config.sampling.coupling)
                # tokenized and checked against the context here, before it waits in the queue
                ids = list(parsed.prompt_ids) if parsed.prompt_ids is not None else \
                    self.pipeline.tokenizer.encode(parsed.prompt, parsed.add_special_tokens)
                encode = functools.partial(self.pipeline.tokenizer.encode, add_special_tokens=False)
                # bad words and the reasoning block's tags tokenized here, where the tokenizer is
                sampling = tokenized(parsed.sampling, encode, parsed.bad_words, parsed.thinking)
                guide = None
                if parsed.guide is not None:
                    try:
                        guide = self.pipeline.guides.compile(parsed.guide)
                    except GuideError as exc:
                        raise RequestError(f"guided_decoding_guide: {exc}") from None
                decode = Request(ids, parsed.max_tokens, sampling, parsed.min_tokens, parsed.end_id,
                                 parsed.stop_token_ids, parsed.ignore_eos, parsed.logprobs,
                                 parsed.prompt_logprobs, guide, tuple(encode(parsed.prediction)),
                                 parsed.cache_salt)
                self.decoder.check(decode)
            except (RequestError, ValueError) as exc:
                self.metrics.errors["invalid_request"].increment(1)
                name = f"{parsed.prompt_input}: " if isinstance(exc, PromptError) else ""
                sender.send(_error(f"{name}{exc}"), flags=FINAL)
                continue
            ends = self.decoder.end_ids_of(decode)  # their own text is left out
            detokenize = self.pipeline.tokenizer.decode  # after the prompt's last ids
            text = TextStream(detokenize, parsed.stop_words, ends, parsed.min_tokens,
                              context_of(detokenize, ids))
            stream = _Stream(parsed, sender, self.outbox, text, self.metrics, decode,
                             interval=self.config.limits.stream_interval)
            if parsed.logprobs is not None:
                stream.logprobs = TokenLogprobs(parsed.logprobs)
            if (busy := self.places.take()) is not None:
                self.metrics.errors["server_busy"].increment(1)
                sender.send(_error(busy, unavailable=True), flags=FINAL)
                continue
            stream.place = self.places
            self.waiting.put(stream)
        return None

    def _admit(self, running: dict[int, _Stream]) -> None:
        """Move queued requests into the decoder in arrival order, blocking briefly when nothing
        runs or waits."""
        try:
            if not running and not self.queued:
                self.queued.append(self.waiting.get(timeout=0.05))
            while True:
                self.queued.append(self.waiting.get_nowait())
        except queue.Empty:
            pass
        self._drop_cancelled()
        while len(running) < self.config.limits.max_concurrency and self.queued:
            stream = self.queued.popleft()
            if stream.cancelled():
                stream.send(None, FINAL)
                continue
            try:
                rid = self.decoder.add(stream.decode, stream.on_tokens)
                if stream.request.include_input:
                    stream.prompt_ids = stream.decode.prompt
            except ValueError as exc:
                self.metrics.errors["invalid_request"].increment(1)
                name = f"{stream.request.prompt_input}: " if isinstance(exc, PromptError) else ""
                stream.send(functools.partial(_error, f"{name}{exc}"), FINAL)
                continue
            except Exception as exc:  # the model's own (memory, a bug): answered here, the step fails
                self.metrics.errors["generation_failed"].increment(1)
                stream.send(functools.partial(_error, f"{GENERATION_FAILED}{exc}", bad_request=False), FINAL)
                raise
            self.metrics.queue.observe(time.monotonic() - stream.queued_at)
            running[rid] = stream

    def _drop_cancelled(self) -> None:
        """Answer and forget the queued requests whose clients cancelled or went away (every
        WAITING_POLL_S at most: each question crosses to Triton's process)."""
        now = time.monotonic()
        if not self.queued or now - self._swept_at < WAITING_POLL_S:
            return
        self._swept_at = now
        kept: deque[_Stream] = deque()
        for stream in self.queued:
            if stream.cancelled():
                stream.send(None, FINAL)
            else:
                kept.append(stream)
        self.queued = kept

    def _drop_cancelled_prefills(self, running: dict[int, _Stream]) -> None:
        """Free the slots of running requests still in their prefill whose clients cancelled or went
        away. Such a request emits nothing, so `on_tokens` (which notices for the others) would not
        hear of it before its whole prompt was fed: a long prompt in limits.prefill_chunk pieces
        held its slot and the steps' compute for seconds after the client left."""
        for rid, stream in list(running.items()):
            if not stream.got_first_token and stream.cancelled():
                self.decoder.cancel(rid)
                stream.send(None, FINAL)
                del running[rid]

    def _serve(self) -> None:
        running: dict[int, _Stream] = {}
        while not self.stopping.is_set():
            try:
                if self._stop_due():
                    self._end_unfinished(running)
                self._admit(running)
                self._drop_cancelled_prefills(running)
                self.metrics.load(len(running), len(self.queued) + self.waiting.qsize())
                if not running:
                    self.metrics.flush_steps()
                    continue
                self._planted_failure(running)
                finished = self.decoder.step()
                self.metrics.count_step()
                for rid, result in finished.items():
                    self.metrics.record(result)
                    if result.error is not None:
                        self.metrics.errors["invalid_request"].increment(1)
                    running[rid].finish(result)
                    del running[rid]  # after its last response: a finish that fails is answered below
            except Exception as exc:  # noqa: BLE001 - the instance must outlive any one failure
                log.exception("decoding step failed")
                self.metrics.errors["generation_failed"].increment(len(running))
                failed = functools.partial(_error, f"{GENERATION_FAILED}{exc}", bad_request=False)
                for stream in running.values():  # after its queued responses
                    stream.send(failed, FINAL)
                running.clear()
                self.decoder.reset()
        self._end_unfinished(running)

    def _stop_due(self) -> bool:
        """Whether the server is stopping and the time it gives unfinished requests has passed
        (`trtspec.triton.server.STOP_FILE_ENV`; looked at every WAITING_POLL_S)."""
        now = time.monotonic()
        if self._stop_file is None or now - self._stop_checked_at < WAITING_POLL_S:
            return False
        self._stop_checked_at = now
        try:
            due = float(self._stop_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # not stopping (or the file half written: next time)
            return False
        return time.time() >= due

    def _end_unfinished(self, running: dict[int, _Stream]) -> None:
        """The server is stopping and its time for them is up, or the model is being unloaded: every
        request still running, queued or waiting gets its final response, an error saying so. Triton
        waits for each request's final response before it exits; without them it was killed 15 s
        later and its gRPC clients' streams were cut without a word."""
        unfinished = [*running.values(), *self.queued]
        while True:
            try:
                unfinished.append(self.waiting.get_nowait())
            except queue.Empty:
                break
        stopping = functools.partial(_error, f"{SHUTTING_DOWN}this request was not finished",
                                     unavailable=True)
        for stream in unfinished:
            stream.send(stopping, FINAL)
        for rid in running:
            self.decoder.cancel(rid)
        running.clear()
        self.queued.clear()

    def _planted_failure(self, running: dict[int, _Stream]) -> None:
        """test_only.fail_on_max_tokens: fail this step as a fault of the model's own would."""
        planted = self._planted_max_tokens
        if planted is not None and any(s.request.max_tokens == planted for s in running.values()):
            raise RuntimeError(f"test_only.fail_on_max_tokens: a request of max_tokens {planted} is running")

    def finalize(self) -> None:
        self.stopping.set()
        self.loop.join(timeout=10)
        self.outbox.close()
        self.pipeline = None


def _input(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()
