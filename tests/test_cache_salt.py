"""cache_salt (vLLM's request field): what a request shares with earlier ones — the K/V a finished
request left in a slot (prefix reuse) and the lookup pool's texts — it shares only with requests sent
with the same salt. Checked in the decoder (the cached prompt tokens and pool copies by salt, the
texts the same whatever the salt) and served (gRPC and the OpenAI API, behind a real tritonserver)."""

from __future__ import annotations

import pytest

from trtspec.config import LookupConfig, load_build_config
from trtspec.pipeline import load_pipeline
from trtspec.spec.decoder import Request, SpeculativeDecoder

from .conftest import REPO

SYSTEM = list(b"You are a careful assistant. Answer briefly, show your working, and never guess. ")


@pytest.fixture(scope="module")
def pipeline():
    return load_pipeline(load_build_config(REPO / "build_configs" / "tiny-dflash.yaml"), use_drafter=False)


def test_prefix_reuse_keeps_a_slot_for_its_salt(pipeline):
    """One slot, requests one after another sharing a system prompt: the second keeps the first's
    K/V only with the same salt; the texts are the same either way."""
    decoder = pipeline.decoder_for(1, prefix_reuse=True)
    first = Request(SYSTEM + list(b"Q: 12 * 7"), 24, cache_salt="a")
    results = {}
    for salt in ("a", "b", ""):
        second = Request(SYSTEM + list(b"Q: 3 + 4"), 24, cache_salt=salt)
        results[salt] = decoder.generate_batch([first, second])[1]  # the second after the first
    assert results["a"].cached_tokens >= len(SYSTEM)
    assert results["b"].cached_tokens == results[""].cached_tokens == 0
    assert results["a"].token_ids == results["b"].token_ids == results[""].token_ids


def test_the_lookup_pool_copies_only_its_salts_texts(pipeline):
    """Two requests of one prompt through one slot: the second copies from the first's answer in the
    pool only with the same salt, and answers the same either way."""
    prompt = list(b"def parse(self, text):\n")
    runs = {}
    for salts in (("a", "a"), ("a", "b"), ("", "")):
        decoder = SpeculativeDecoder(pipeline.target, None, pipeline.end_ids, max_slots=1,
                                     lookup=LookupConfig(pool_tokens=4096))
        runs[salts] = decoder.generate_batch([Request(prompt, 64, cache_salt=s) for s in salts])
    assert runs["a", "a"][1].num_pooled > 0 and runs["", ""][1].num_pooled > 0
    assert runs["a", "b"][1].num_pooled == 0
    texts = {tuple(tuple(r.token_ids) for r in results) for results in runs.values()}
    assert len(texts) == 1


def test_a_served_deployment_keeps_prompts_and_pool_by_salt(tmp_path):
    """tiny-lookup-pool.yaml behind a real tritonserver and the OpenAI frontend: over gRPC a prompt
    sharing a cached prefix keeps it with the same salt only (another salt, or none, takes a fresh
    slot and prefills all), the answers the same; over the OpenAI API the salt reaches the model
    (usage's cached tokens), and an empty one is refused naming cache_salt; `bench --url
    --salt-per-level` keeps a level from reusing an earlier level's prompts."""
    import json

    from click.testing import CliRunner

    from trtspec.cli import main
    from trtspec.openai.model_info import served_model_of_repo
    from trtspec.openai.server import OpenAIFrontend
    from trtspec.triton.client import GenerateParams, generate
    from trtspec.triton.repo import REPO_DIR, write_triton_repo
    from trtspec.triton.server import TritonServer

    from .conftest import free_port, post_json, triton_ports, tritonserver_pids

    config = load_build_config(REPO / "build_configs" / "tiny-lookup-pool.yaml")
    write_triton_repo(config, tmp_path)
    server = TritonServer(tmp_path / REPO_DIR, ports=triton_ports(), exit_timeout_s=3,
                          env={"OMP_NUM_THREADS": "1"})
    frontend = None
    system = bytes(SYSTEM).decode()
    try:
        server.start(timeout_s=180)
        cached, texts = {}, set()
        for salt, question in (("a", "Q: 12 * 7"), ("b", "Q: 3 + 4"), ("", "Q: 3 + 4"), ("a", "Q: 3 + 4")):
            got = generate(server.grpc_url, config.name, system + question,
                           GenerateParams(max_tokens=16, stream=True, cache_salt=salt))
            cached[salt, question] = got.cached_tokens
            if question == "Q: 3 + 4":
                texts.add(tuple(got.token_ids))
        assert cached["a", "Q: 3 + 4"] >= len(SYSTEM) and len(texts) == 1
        assert cached["b", "Q: 3 + 4"] == cached["", "Q: 3 + 4"] == 0
        # `trtspec generate --url … --cache-salt`: the same keeping, in its JSON
        ask = ["generate", "--url", server.grpc_url, "--model", config.name, "--prompt", system + "Q: 9 - 1",
               "--max-tokens", "8", "--json", "--cache-salt"]
        runs = {salt: CliRunner().invoke(main, [*ask, salt]) for salt in ("a", "d")}
        assert all(run.exit_code == 0 for run in runs.values()), [run.output for run in runs.values()]
        kept = {salt: json.loads(run.output)["cached_tokens"] for salt, run in runs.items()}
        assert kept["a"] >= len(SYSTEM) and kept["d"] == 0, kept
        frontend = OpenAIFrontend(served_model_of_repo(tmp_path / REPO_DIR), server.local_grpc_address,
                                  "127.0.0.1", free_port()).start()
        usage = {}
        for salt in ("a", "c"):
            status, body = post_json(f"{frontend.url}/v1/completions", {
                "model": config.name, "prompt": system + "Q: 5 - 2", "max_tokens": 8, "cache_salt": salt})
            assert status == 200, body
            usage[salt] = body["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert usage["a"] >= len(SYSTEM) and usage["c"] == 0
        status, body = post_json(f"{frontend.url}/v1/completions", {
            "model": config.name, "prompt": "x", "max_tokens": 8, "cache_salt": ""})
        assert status == 400 and body["error"]["param"] == "cache_salt", body
        # bench --url sends level 2 the prompts level 1 sent: kept by prefix reuse, unless salted per level
        cached = {}
        for flag in ([], ["--salt-per-level"]):
            out = tmp_path / f"bench{len(flag)}"
            result = CliRunner().invoke(main, ["bench", "--url", server.grpc_url, "--model", config.name,
                                               "--tasks", "code", "--prompts", "2", "--max-tokens", "8",
                                               "--concurrency", "1,2", "--out", str(out), *flag])
            assert result.exit_code == 0, result.output
            remote = json.loads((out / "results.json").read_text())["remote"]
            cached[bool(flag)] = [[x["cached_tokens"] for x in remote["levels"][r]["requests"]] for r in "12"]
        assert min(cached[False][1]) > 0 and cached[True] == [[0, 0], [0, 0]], cached
    finally:
        if frontend is not None:
            frontend.stop()
        server.stop()
        assert tritonserver_pids(str(tmp_path)) == []
