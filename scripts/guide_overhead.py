"""What a guide costs the decode loop's host side: choosing a DFlash block's drafts under a guide, and
masking a verify step's positions, beside the same choice unguided (synthetic logits, the tiny
DFlash pipeline's 264-token vocabulary).

    python scripts/guide_overhead.py
"""

from __future__ import annotations

import time

import torch

from trtspec.config import load_build_config
from trtspec.models.dflash_drafter import propose_block
from trtspec.models.drafter import DraftRow
from trtspec.pipeline import load_pipeline
from trtspec.spec.grammar import Guide, GuideState
from trtspec.spec.sampling import SamplingParams

REGEX = r"( [0-9]+[-+*/][0-9]+=[0-9]+;)+ = [0-9]+\n"  # scripts/guide_tau.py's math guide
CALLS = 300


def _ms(work) -> float:
    start = time.perf_counter()
    for _ in range(CALLS):
        work()
    return (time.perf_counter() - start) / CALLS * 1e3


def main() -> None:
    pipeline = load_pipeline(load_build_config("build_configs/tiny-dflash.yaml"))
    vocab = pipeline.target.vocab_size
    state = GuideState(pipeline.guides.compile(Guide("regex", REGEX)), pipeline.end_ids, vocab)
    gen = torch.Generator().manual_seed(0)
    block = torch.randn(1, 15, vocab, generator=gen)  # [R, k, V]
    block[..., ord("0") : ord("9") + 1] += 5  # digits lead: the guide allows the argmax in most slots
    guided = DraftRow(0, [1, 2, 3], SamplingParams(), torch.Generator(), state)
    plain = DraftRow(0, [1, 2, 3], SamplingParams(), torch.Generator())

    def choose_guided() -> None:
        propose_block(block, [guided])
        state.end_drafts()

    drafts = torch.randint(ord("0"), ord("9") + 1, (16,), generator=gen)  # a step's fed drafts
    step = torch.randn(16, vocab, generator=gen)  # [s, V]
    print(f"DFlash block of 15 drafts: unguided {_ms(lambda: propose_block(block, [plain])):.3f} ms, "
          f"guided {_ms(choose_guided):.3f} ms")
    print(f"verify step of 16 positions masked: {_ms(lambda: state.mask(step.clone(), drafts)):.3f} ms")


if __name__ == "__main__":
    main()
