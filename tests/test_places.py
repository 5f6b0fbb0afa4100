"""The served model's places (limits.max_queued): each request holds one from `execute` to its final
response, on every path it ends by. The Python backend's utilities exist only inside Triton's stub;
a stand-in module takes their place here, and the served paths (a full queue refused as busy, a
failed step, a stop) run behind a real tritonserver in tests/test_openai.py and test_serve_stop.py."""

from __future__ import annotations

import importlib
import queue
import random
import sys
import time
import types
from collections import deque

import pytest

from .test_outbox import Sender


class _Error:
    INVALID_ARG, INTERNAL, UNAVAILABLE = "INVALID_ARG", "INTERNAL", "UNAVAILABLE"

    def __init__(self, message: str, code: str):
        self.message, self.code = message, code


class _Response:
    def __init__(self, output_tensors=None, error=None):
        self.error = error


@pytest.fixture
def model(monkeypatch):
    """trtspec.triton.model imported over the stand-in utilities (and forgotten after)."""
    utils = types.ModuleType("triton_python_backend_utils")
    utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    utils.TritonError, utils.InferenceResponse = _Error, _Response
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    monkeypatch.delitem(sys.modules, "trtspec.triton.model", raising=False)
    module = importlib.import_module("trtspec.triton.model")
    yield module
    sys.modules.pop("trtspec.triton.model", None)


class _Count:
    def increment(self, n: int) -> None:
        pass

    def observe(self, value: float) -> None:
        pass


def _instance(model, decoder, slots: int = 2, max_queued: int = 0):
    """A model instance with the parts `_admit` uses: limits, decoder, metrics, queues, places."""
    instance = model.TritonPythonModel.__new__(model.TritonPythonModel)
    limits = types.SimpleNamespace(max_concurrency=slots, max_queued=max_queued)
    instance.config = types.SimpleNamespace(limits=limits)
    instance.decoder = decoder
    errors = {reason: _Count() for reason in model.ERROR_REASONS}
    instance.metrics = types.SimpleNamespace(errors=errors, queue=_Count())
    instance.outbox = model.Outbox(model.FINAL)
    instance.waiting, instance.queued = queue.Queue(), deque()
    instance.places = model._Places(slots, max_queued)
    instance._swept_at = time.monotonic()
    return instance


def _queue(model, instance, sender: Sender):
    """A request queued as `execute` queues one: its place taken."""
    stream = model._Stream(request=types.SimpleNamespace(include_input=False, prompt_input="text_input"),
                           sender=sender, outbox=instance.outbox, text=None, metrics=instance.metrics,
                           decode=None)
    assert instance.places.take() is None
    stream.place = instance.places
    instance.waiting.put(stream)


def test_a_request_the_decoder_fails_to_take_is_answered_and_gives_its_place_back(model):
    """Found reviewing the change (2026-12-06): `_admit` answered only a ValueError of decoder.add; a
    RuntimeError (CUDA out of memory taking the slot, a bug) left the request unanswered and its
    place held for good, so a full bound refused every request after. Now it gets the step's
    "generation failed" and its place back, and the step fails as any failing step does."""
    class Failing:
        def add(self, decode, on_tokens):
            raise RuntimeError("CUDA out of memory")

    instance = _instance(model, Failing())
    senders = [Sender(), Sender()]
    for sender in senders:
        _queue(model, instance, sender)
    assert instance.places.take() is not None  # 2 slots, none to wait: busy
    running: dict = {}
    for _ in senders:
        with pytest.raises(RuntimeError, match="CUDA out of memory"):
            instance._admit(running)
    instance.outbox.close()
    for sender in senders:
        ((response, flags, _),) = sender.got
        assert flags == model.FINAL and response.error.code == _Error.INTERNAL
        assert response.error.message == "generation failed: CUDA out of memory"
    assert instance.places.count == 0 and instance.places.take() is None


def test_the_frontend_knows_how_many_requests_a_bounded_deployment_holds(tmp_path):
    """What the OpenAI API refuses a request of too many choices by (a 400 naming n): the
    instances' slots and queues together, an instance per GPU; no bound without limits.max_queued."""
    from trtspec.config import load_build_config
    from trtspec.openai.model_info import served_model

    config = tmp_path / "c.yaml"
    for extra, held in (("", None), ("limits: {max_concurrency: 4, max_queued: 3}\n", 7),
                        ("limits: {max_concurrency: 4, max_queued: 0}\ngpus: [0, 1]\n", 8)):
        config.write_text("target: {path: builtin:tiny-target}\n" + extra)
        assert served_model(load_build_config(config)).max_held == held


def test_a_request_whose_client_leaves_in_its_prefill_frees_its_slot_at_the_next_step(model):
    """Found by a fuzz of client disconnects (2026-12-06): a request still feeding its prompt in
    limits.prefill_chunk pieces emits nothing, so its cancellation (heard in `on_tokens`) waited for
    the whole prompt: three clients that left 0.3 s into 1,900-token prompts held their slots 3 s,
    and the request behind them waited as long. Now the loop frees such a slot before the next step,
    the request gets its final response and its place back; one whose client stays goes on."""
    from pathlib import Path

    from trtspec.config import load_build_config
    from trtspec.pipeline import load_pipeline
    from trtspec.spec.decoder import Request, SpeculativeDecoder

    config = load_build_config(Path(__file__).resolve().parents[1] / "build_configs" / "tiny-dflash.yaml")
    pipeline = load_pipeline(config, use_drafter=False)
    decoder = SpeculativeDecoder(pipeline.target, pipeline.drafter, pipeline.end_ids, pipeline.verifier,
                                 capacity=512, max_slots=2, prefill_chunk=16)
    instance = _instance(model, decoder)
    leaving, staying = Sender(), Sender()
    rng = random.Random(3)
    for sender in (leaving, staying):
        _queue(model, instance, sender)
        prompt = [rng.randrange(256) for _ in range(300)]  # 16 tokens a step for both: 38 steps
        instance.waiting.queue[-1].decode = Request(prompt, 4)
    running: dict = {}
    instance._admit(running)
    assert len(running) == 2
    for _ in range(3):
        assert decoder.step() == {}  # still prefilling: no token, no word from on_tokens
    instance._drop_cancelled_prefills(running)
    assert len(running) == 2 and decoder.num_running == 2  # nobody left yet
    leaving.cancelled = True
    time.sleep(model.CANCEL_POLL_S)  # Triton is asked at most that often per request
    instance._drop_cancelled_prefills(running)
    instance.outbox.close()
    assert len(running) == 1 and decoder.num_running == 1
    ((response, flags, _),) = leaving.got
    assert response is None and flags == model.FINAL
    assert staying.got == [] and instance.places.count == 1
