"""Time per decode step, rejection sampling against Gumbel coupling, with the same requests: the
embedded draft-model config, 8 slots, whole blocks, 18 held-out prompts (6 each of code, math,
chat) × 128 tokens at temperature 1, prompt i seeded 1000 + i, served alternately (`generate_batch`)
five times each after a warm-up of one each, one thread. Prints the median ms per step and tokens/s.

    .venv/bin/python scripts/coupling_step_time.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.config import ScheduleConfig, load_build_config  # noqa: E402
from trtspec.pipeline import load_pipeline  # noqa: E402
from trtspec.prompts import load_prompts  # noqa: E402
from trtspec.spec.decoder import Request  # noqa: E402
from trtspec.spec.sampling import SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REPEATS = 5


def main() -> None:
    torch.set_num_threads(1)
    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-draft-model.yaml"))
    decoder = pipeline.decoder_for(8, ScheduleConfig(mode="full"))
    texts = [p for task in ("code", "math", "chat") for p in load_prompts(task)[:6]]
    prompts = [pipeline.tokenizer.encode(p) for p in texts]

    def run(coupling: str) -> tuple[float, float]:
        requests = [Request(ids, 128, SamplingParams(temperature=1.0, seed=1000 + i, coupling=coupling))
                    for i, ids in enumerate(prompts)]
        start = time.perf_counter()
        results = decoder.generate_batch(requests)
        seconds = time.perf_counter() - start
        return 1e3 * seconds / decoder.num_steps, sum(len(r.token_ids) for r in results) / seconds

    couplings = ("rejection", "gumbel")
    for coupling in couplings:  # warm-up
        run(coupling)
    timings: dict[str, list[tuple[float, float]]] = {c: [] for c in couplings}
    for _ in range(REPEATS):
        for coupling in couplings:
            timings[coupling].append(run(coupling))
    for coupling, runs in timings.items():
        print(f"{coupling}: {statistics.median(ms for ms, _ in runs):.1f} ms per step, "
              f"{statistics.median(tps for _, tps in runs):.0f} tokens/s (medians of {REPEATS})")


if __name__ == "__main__":
    main()
