"""cache_salt (vLLM's request field): what a request shares with earlier ones — the K/V a finished
request left in a slot (prefix reuse) and the lookup pool's texts — it shares only with requests sent
with the same salt. Checked in the decoder (the cached prompt tokens and pool copies by salt, the
texts the target alone's whatever the salt)."""

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
