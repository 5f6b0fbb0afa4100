"""The decoupled orchestration model: Triton's Python backend runs this, one instance per slot.

Imported by the generated `<repo>/<name>/1/model.py` inside the backend's stub process, where
`triton_python_backend_utils` exists. Each request runs the draft–verify loop of the build config
copied beside the model (`build_config.yaml`); the instance handles one request at a time, as
the torch decoder does, and Triton queues the rest.

Responses. `stream` false: one response with the whole `text_output`, `output_ids`,
`accepted_tokens`, `draft_tokens`. `stream` true: one response per decode step with the new
`text_output` / `output_ids`, then a last one with the request's `accepted_tokens` /
`draft_tokens` totals (and any text held back). Any bad parameter gets one error response naming it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from trtspec.config import load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.spec.metrics import GenerationResult
from trtspec.triton.repo import BUILD_CONFIG_FILE
from trtspec.triton.request import GenerateRequest, RequestError, TextStream, parse_request

log = logging.getLogger(__name__)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
TAU_BUCKETS = [1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0]


class Metrics:
    """Per-request acceptance on Triton's metrics port (Prometheus), labelled by model."""

    def __init__(self, model: str, version: str):
        labels = {"model": model, "version": version}
        counter, hist = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.HISTOGRAM
        self._families = [
            pb_utils.MetricFamily("trtspec_requests_total", "Requests completed", counter),
            pb_utils.MetricFamily("trtspec_generated_tokens_total", "Tokens generated", counter),
            pb_utils.MetricFamily("trtspec_accepted_tokens_total", "Draft tokens accepted", counter),
            pb_utils.MetricFamily("trtspec_draft_tokens_total", "Draft tokens proposed", counter),
            pb_utils.MetricFamily("trtspec_target_forwards_total", "Target forward passes", counter),
            pb_utils.MetricFamily("trtspec_tau", "Tokens per target forward, per request (tau)", hist),
        ]
        requests, generated, accepted, drafted, forwards, tau = self._families
        self.requests = requests.Metric(labels=labels)
        self.generated = generated.Metric(labels=labels)
        self.accepted = accepted.Metric(labels=labels)
        self.drafted = drafted.Metric(labels=labels)
        self.forwards = forwards.Metric(labels=labels)
        self.tau = tau.Metric(labels=labels, buckets=TAU_BUCKETS)

    def record(self, result: GenerationResult) -> None:
        self.requests.increment(1)
        self.generated.increment(len(result.token_ids))
        self.accepted.increment(result.num_accepted)
        self.drafted.increment(result.num_drafted)
        self.forwards.increment(result.num_target_calls)
        self.tau.observe(result.tau)


def _tensor(name: str, value) -> pb_utils.Tensor:
    return pb_utils.Tensor(name, np.asarray(value))


def _response(text: str, ids: list[int], accepted: int, drafted: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(
        output_tensors=[
            _tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),  # [1]
            _tensor("output_ids", np.array(ids, dtype=np.int32)),  # [n]
            _tensor("accepted_tokens", np.array([accepted], dtype=np.int32)),  # [1]
            _tensor("draft_tokens", np.array([drafted], dtype=np.int32)),  # [1]
        ]
    )


def _error(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        model_dir = Path(args["model_repository"])
        self.config = load_build_config(model_dir / args["model_version"] / BUILD_CONFIG_FILE)
        self.pipeline = load_pipeline(self.config)
        self.limit = self.config.limits.max_tokens
        self.metrics = Metrics(args["model_name"], args["model_version"])
        model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(model_config):
            raise pb_utils.TritonModelException(f"{args['model_name']}: the model must be decoupled")
        log.info("%s ready on %s %s", args["model_instance_name"], args["model_instance_kind"],
                 args["model_instance_device_id"])

    def execute(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_request(lambda name, r=request: _input(r, name), self.limit)
            except RequestError as exc:
                sender.send(_error(str(exc)), flags=FINAL)
                continue
            try:
                self._generate(parsed, sender)
            except Exception as exc:  # noqa: BLE001 - the instance must outlive any one request
                log.exception("request failed")
                _send_quietly(sender, _error(f"generation failed: {exc}"), FINAL)
        return None

    def _generate(self, request: GenerateRequest, sender) -> None:
        pipeline = self.pipeline
        text = TextStream(pipeline.tokenizer.decode, request.stop_words)

        def on_tokens(new_ids: list[int]) -> bool:
            delta, kept = text.push(new_ids)
            if request.stream and (delta or kept):
                if not _send_quietly(sender, _response(delta, kept, 0, 0), 0):
                    return True  # the client is gone: free the instance
            return text.stopped or sender.is_cancelled()

        result = pipeline.decoder.generate(
            pipeline.tokenizer.encode(request.prompt), request.max_tokens, request.sampling, on_tokens
        )
        self.metrics.record(result)
        if request.stream:
            final = _response(text.finish(), [], result.num_accepted, result.num_drafted)
        else:
            final = _response(text.text, text.ids, result.num_accepted, result.num_drafted)
        _send_quietly(sender, final, FINAL)

    def finalize(self) -> None:
        self.pipeline = None


def _input(request, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _send_quietly(sender, response, flags: int) -> bool:
    """Send; False when the request is cancelled or its client went away."""
    if sender.is_cancelled():
        if flags == FINAL:
            try:
                sender.send(flags=FINAL)
            except Exception:  # noqa: BLE001
                return False
        return False
    try:
        sender.send(response, flags=flags)
    except Exception as exc:  # noqa: BLE001 - a dropped client must not end the instance
        log.warning("could not send a response: %s", exc)
        return False
    return True
