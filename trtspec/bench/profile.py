"""`trtspec profile`: the target's steps per second at each verify batch size B, on this machine.

The prefix scheduler trades expected accepted tokens against the cost of verifying them, so it
needs SPS(B): how many packed target forwards of B tokens run per second. We measure it the way
serving runs it: `requests` sequences of `context` tokens share the cache and B new tokens are
spread over them (round robin), then rewound, so every repetition sees the same cache.
"""

from __future__ import annotations

import os
import platform
import statistics
import time

import torch
from tqdm import tqdm

from trtspec.models.packed_target import Chunk, PackedTarget
from trtspec.spec.schedule import SPSTable

DEFAULT_BATCHES = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]


def profile_sps(target: PackedTarget, batch_tokens: list[int] | None = None, requests: int = 8,
                context: int = 256, reps: int = 15, seed: int = 0) -> SPSTable:
    """Median steps/s of one packed forward per B, B values interleaved across repetitions."""
    batch_tokens = sorted(batch_tokens or DEFAULT_BATCHES)
    gen = torch.Generator().manual_seed(seed)
    vocab = min(256, target.config.vocab_size)
    target.reset()
    target.forward([Chunk(r, torch.randint(0, vocab, (context,), generator=gen)) for r in range(requests)])
    times: dict[int, list[float]] = {b: [] for b in batch_tokens}
    for _ in tqdm(range(reps), desc="profile", unit="rep"):
        for b in batch_tokens:
            sizes = [b // requests + (r < b % requests) for r in range(requests)]
            chunks = [Chunk(r, torch.randint(0, vocab, (n,), generator=gen))
                      for r, n in enumerate(sizes) if n]
            t0 = time.perf_counter()
            target.forward(chunks)
            times[b].append(time.perf_counter() - t0)
            for c in chunks:
                target.rewind(c.request, len(c.input_ids))
            target.compact(min_dead_fraction=0.0)
    machine = f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} " \
              f"({torch.get_num_threads()} threads), {requests} requests × {context} cached tokens"
    return SPSTable(batch_tokens=batch_tokens,
                    steps_per_s=[round(1.0 / statistics.median(times[b]), 3) for b in batch_tokens],
                    machine=machine)
