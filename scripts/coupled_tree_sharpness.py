"""τ of Gumbel-coupled draft trees when the drafters' coupled scores are sharpened or flattened.

A coupled row's tree ranks tokens by log_softmax(log q + g) (`trtspec.spec.tree.log_scores`). This
measures log_softmax((log q + g) / β) for a few β instead: within a depth the order of the
children is the same for every β, but a path's score (a sum over its depths) weighs depth against
width differently, so β moves the node budget between deeper paths (β < 1) and more siblings
(β > 1). τ is counted, not timed: the seeds fix every text, so the figures repeat exactly.

The embedded configs named on the command line, whole blocks, R = 1, trees of 12 nodes with top-4
children, 18 held-out prompts (6 each of code, math, chat) × 128 tokens at temperature 1, prompt i
seeded 1000 + i, one thread. Prints τ per config and β.

    .venv/bin/python scripts/coupled_tree_sharpness.py tiny-dflash tiny-dspark tiny-eagle3 tiny-draft-model
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config  # noqa: E402
from trtspec.models import dflash_drafter, draft_model, dspark_drafter, eagle3_drafter  # noqa: E402
from trtspec.pipeline import load_pipeline  # noqa: E402
from trtspec.prompts import load_prompts  # noqa: E402
from trtspec.spec import tree  # noqa: E402
from trtspec.spec.coupling import coupled_rows  # noqa: E402
from trtspec.spec.decoder import Request  # noqa: E402
from trtspec.spec.sampling import SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BETAS = (0.25, 0.5, 1.0, 2.0)
DRAFTER_MODULES = (dflash_drafter, draft_model, dspark_drafter, eagle3_drafter)  # each imports log_scores


def sharpened(beta: float):
    """`tree.log_scores` with each coupled row's scores renormalised at 1/β: log_softmax(s / β) of
    s = log_softmax(log q + g) is log_softmax((log q + g) / β), the row's constant cancelling."""

    def log_scores(logits: torch.Tensor, params, positions=None) -> torch.Tensor:
        scores = tree.log_scores(logits, params, positions)  # [R, ..., V]
        coupled = coupled_rows(params)
        if coupled and beta != 1.0:
            scores[coupled] = torch.log_softmax(scores[coupled] / beta, -1)
        return scores

    return log_scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("configs", nargs="+", help="names of build_configs/*.yaml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts = [p for task in ("code", "math", "chat") for p in load_prompts(task)[:6]]
    for name in args.configs:
        pipeline = load_pipeline(load_build_config(REPO / "build_configs" / f"{name}.yaml"))
        requests = [Request(pipeline.tokenizer.encode(prompt), 128,
                            SamplingParams(temperature=1.0, seed=1000 + i, coupling="gumbel"))
                    for i, prompt in enumerate(prompts)]
        for beta in BETAS:
            for module in DRAFTER_MODULES:
                module.log_scores = sharpened(beta)
            decoder = pipeline.decoder_for(1, ScheduleConfig(mode="full"), tree=TreeConfig(nodes=12, topk=4))
            results = decoder.generate_batch(requests)
            tokens = sum(len(r.token_ids) for r in results)
            calls = sum(r.num_target_calls for r in results)
            print(f"{name:18s} beta={beta:<5} tau={tokens / calls:.3f}", flush=True)


if __name__ == "__main__":
    main()
