"""Peak memory of prompt_logprobs on a real vocabulary: a random-weight target with Qwen3-8B's
151,936-token vocabulary (2 layers, hidden 256, so the logits are what weighs), one request of a
P-token prompt asking for its prompt's log-probabilities, scored in pieces of CHUNK tokens (the
decoder's `prompt_logprobs_chunk`; CHUNK >= P is the whole prompt in one forward, as before pieces).
Each setting runs in a process of its own and reports its peak resident memory.

    .venv/bin/python scripts/prompt_logprobs_memory.py [--prompt 4096] [--chunks 512,4096]
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _one(prompt_len: int, chunk: int) -> None:
    import torch

    from trtspec.bench.synthetic import build_target, small_architecture
    from trtspec.models.target import TargetModel
    from trtspec.plan.models import get_target
    from trtspec.spec.decoder import Request, SpeculativeDecoder

    arch = dataclasses.replace(small_architecture(get_target("Qwen/Qwen3-8B"), 2), vocab=151_936)
    model = build_target(arch, "qwen3", torch.device("cpu"), torch.float32, prompt_len + 8, seed=0)
    decoder = SpeculativeDecoder(TargetModel(model), None, (), max_slots=1, capacity=prompt_len + 8,
                                 prompt_logprobs_chunk=chunk)
    prompt = torch.randint(0, arch.vocab, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = decoder.generate_batch([Request(prompt, 1, prompt_logprobs=1)])[0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{peak / 2**20:.2f} {(peak - before) / 2**20:.2f} {len(result.prompt_logprobs)} "
          f"{sum(result.prompt_logprobs.values):.6f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--chunks", default="512,4096")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        _one(args.prompt, args.one)
        return
    print(f"prompt of {args.prompt} tokens, vocabulary 151,936, float32 logits; peak RSS per process (GiB)\n")
    print("| prompt_logprobs_chunk | peak RSS (GiB) | growth in generate (GiB) | tokens scored "
          "| sum of log p |")
    print("|---:|---:|---:|---:|---:|")
    for chunk in (int(c) for c in args.chunks.split(",")):
        out = subprocess.run([sys.executable, __file__, "--prompt", str(args.prompt), "--one", str(chunk)],
                             capture_output=True, text=True, check=True).stdout.split()
        print(f"| {chunk} | {out[0]} | {out[1]} | {out[2]} | {out[3]} |", flush=True)


if __name__ == "__main__":
    main()
