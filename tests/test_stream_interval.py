"""`limits.stream_interval`: a streaming request gets a response every interval-th decode step with
what the steps since its last held (TensorRT-LLM's rule: the first step's output at once, then
steps interval, 2·interval, …, the rest with the final response), served by a real tritonserver.
The streamed ids, text and log-probabilities add up to the unstreamed answer, which is the torch
flavour's in this process; the trtllm flavour writes TensorRT-LLM's own stream_interval.
"""

from __future__ import annotations

import json
import queue
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.config import ConfigError, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.spec.decoder import Request
from trtspec.triton.client import GenerateParams, grpc_inputs
from trtspec.trtllm import fields
from trtspec.trtllm.args import llm_args

from .conftest import REPO, triton_serving

INTERVAL = 3
MAX_TOKENS = 23  # not a multiple of INTERVAL: the final response carries steps no response streamed
PROMPTS = ("Q: 482 + 356\nA:", "def parse(self, text):\n", "import os\n")


def _config_file(tmp_path, interval: int) -> str:
    """The embedded target alone (one token per decode step), streamed every `interval` steps."""
    path = tmp_path / "alone.yaml"
    path.write_text(yaml.safe_dump({"name": "alone", "target": {"path": "builtin:tiny-target"},
                                    "limits": {"max_tokens": 256, "stream_interval": interval}}))
    return str(path)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return load_build_config(_config_file(tmp_path_factory.mktemp("config"), INTERVAL))


@pytest.fixture(scope="module")
def expected(config):
    """Greedy ids and each id's log p, in this process."""
    pipeline = load_pipeline(config)
    out = {}
    for prompt in PROMPTS:
        ids = pipeline.tokenizer.encode(prompt)
        result = pipeline.batch_decoder().generate_batch([Request(ids, MAX_TOKENS, logprobs=0)])[0]
        out[prompt] = (result.token_ids, result.logprobs.values)
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory, config, request):
    with triton_serving(config, tmp_path_factory.mktemp("triton-build"),
                        lambda: request.getfixturevalue("expected")) as server:
        yield server


def _responses(server, model: str, prompt: str, stream: bool, logprobs: bool) -> list[dict]:
    """Every response of one request over a gRPC stream, in order: its outputs as numpy arrays."""
    params = GenerateParams(max_tokens=MAX_TOKENS, stream=stream)
    inputs = grpc_inputs(prompt, params)
    if logprobs:
        one = grpcclient.InferInput("return_log_probs", [1], "BOOL")
        one.set_data_from_numpy(np.array([True]))
        inputs.append(one)
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url.removeprefix("grpc://"))
    responses = []
    try:
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex,
                                  enable_empty_final_response=True)
        while True:
            result, error = got.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                responses.append({out.name: result.as_numpy(out.name) for out in response.outputs})
            if response.parameters["triton_final_response"].bool_param:
                return responses
    finally:
        client.stop_stream()
        client.close()


def _streamed_ids_per_response(tokens: int, interval: int) -> list[int]:
    """TensorRT-LLM's rule at one token a step: step 1's id, then the ids of the steps up to each
    multiple of `interval`, then the rest in the final response (none when the last step streamed)."""
    sent, counts = 0, []
    for step in range(1, tokens + 1):
        if step == 1 or step % interval == 0:
            counts.append(step - sent)
            sent = step
    return counts + [tokens - sent]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_a_response_every_interval_steps_adds_up_to_the_answer(served, config, expected, prompt):
    want_ids, want_logprobs = expected[prompt]
    assert len(want_ids) == MAX_TOKENS  # no end id: every step gives one token
    streamed = _responses(served, config.name, prompt, stream=True, logprobs=True)
    counts = [len(r["output_ids"]) for r in streamed]
    assert counts == _streamed_ids_per_response(MAX_TOKENS, INTERVAL)
    assert counts[:3] == [1, 2, 3]
    ids = [int(i) for r in streamed for i in r["output_ids"]]
    assert ids == want_ids
    text = b"".join(r["text_output"][0] for r in streamed).decode()
    assert text == bytes(want_ids).decode("utf-8", errors="replace")  # the byte-level tokenizer
    # each response's log p per id, and the running sum so far in cum_log_probs
    carrying = [r for r in streamed if len(r["output_ids"])]
    assert all(len(r["output_log_probs"]) == len(r["output_ids"]) for r in carrying)
    logprobs = np.concatenate([r["output_log_probs"] for r in carrying])
    np.testing.assert_allclose(logprobs, want_logprobs, atol=1e-4)
    running = np.cumsum(logprobs)[np.cumsum([len(r["output_ids"]) for r in carrying]) - 1]
    np.testing.assert_allclose([r["cum_log_probs"][0] for r in carrying], running, atol=1e-3)
    # not streamed: one response, the same answer
    (whole,) = _responses(served, config.name, prompt, stream=False, logprobs=True)
    assert [int(i) for i in whole["output_ids"]] == want_ids
    np.testing.assert_allclose(whole["output_log_probs"], logprobs, atol=1e-5)


def test_bench_url_reports_how_the_tokens_came(served, config, tmp_path):
    """`bench --url` counts the responses that carried tokens and the longest wait between two: at
    one token a step and a response every 3 steps, about 3 tokens a response."""
    result = CliRunner().invoke(main, ["bench", "--url", served.grpc_url, "--model", config.name,
                                       "--tasks", "code", "--prompts", "2", "--max-tokens", str(MAX_TOKENS),
                                       "--concurrency", "1", "--out", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    row = json.loads((tmp_path / "bench" / "results.json").read_text())["remote"]["levels"]["1"]
    counts = _streamed_ids_per_response(MAX_TOKENS, INTERVAL)  # every code prompt runs to max_tokens
    assert [x["responses"] for x in row["requests"]] == [len(counts)] * 2
    assert row["tokens_per_response"] == pytest.approx(MAX_TOKENS / len(counts), abs=0.01)
    assert all(0 < x["longest_gap_s"] < x["latency_s"] for x in row["requests"])


def test_interval_one_streams_every_step():
    assert _streamed_ids_per_response(5, 1) == [1, 1, 1, 1, 1, 0]
    assert _streamed_ids_per_response(7, 3) == [1, 2, 3, 1]


def test_a_bad_interval_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="limits.stream_interval"):
        load_build_config(_config_file(tmp_path, 0))


@pytest.mark.parametrize("interval, written", [(1, False), (4, True)])
def test_trtllm_gets_tensorrt_llms_stream_interval(tmp_path, interval, written):
    raw = yaml.safe_load((REPO / "build_configs" / "llama3.1-8b-dflash.yaml").read_text())
    raw["limits"]["stream_interval"] = interval
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    args = llm_args(load_build_config(path), for_triton=False)
    assert args.get("stream_interval") == (interval if written else None)
    assert set(args) <= fields.LLM_ARGS_FIELDS
