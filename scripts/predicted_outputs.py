"""What a predicted output (OpenAI's `prediction`) saves: a rewrite whose answer is mostly known.

For each held-out prompt the target's greedy answer is taken as the text to rewrite, edited at
--edits random places (a stretch of a few characters deleted, inserted or changed), and sent as the
prediction of the same request: its answer must be the same (the script stops if not), in fewer
target forwards. Four ways, interleaved prompt by prompt after one untimed run each: the target
alone, the deployment's drafter, and each of them with the prediction.

    .venv/bin/python scripts/predicted_outputs.py [--config build_configs/tiny-dflash.yaml] \\
        [--tasks code,chat,math] [--prompts 8] [--max-tokens 256] [--edits 3] [--tree NODES,TOPK]

--tree drafts the drafter's top-k trees of NODES nodes (`drafter.tree`); a predicted request then
drafts a chain from its prediction beside them.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config  # noqa: E402
from trtspec.pipeline import load_pipeline  # noqa: E402
from trtspec.prompts import load_prompts  # noqa: E402
from trtspec.runtime import configure_threads  # noqa: E402
from trtspec.spec.decoder import Request, SpeculativeDecoder  # noqa: E402


def edited(rng: random.Random, text: str, edits: int) -> str:
    for _ in range(edits):
        at, n = rng.randrange(max(1, len(text))), rng.randint(2, 12)
        kind = rng.choice(["delete", "insert", "change"])
        new = "".join(rng.choice("abcdefghij _") for _ in range(n))
        text = text[:at] + ("" if kind == "delete" else new) + text[at + (0 if kind == "insert" else n):]
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="build_configs/tiny-dflash.yaml")
    parser.add_argument("--tasks", default="code,chat,math")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--edits", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tree", default=None, help="NODES,TOPK: draft trees (default: the config's)")
    args = parser.parse_args()
    config = load_build_config(args.config)
    configure_threads(config)
    pipeline = load_pipeline(config)
    tok, rng = pipeline.tokenizer, random.Random(args.seed)
    tree = "config"
    if args.tree:
        nodes, topk = map(int, args.tree.split(","))
        tree = TreeConfig(nodes=nodes, topk=topk)
    spec = pipeline.decoder_for(1, ScheduleConfig(mode="full"), tree=tree)
    plain = SpeculativeDecoder(pipeline.target, None, spec.end_ids)
    drafter = config.drafter.method + (" tree" if spec.tree is not None else "")
    ways = {"target alone": (plain, False), drafter: (spec, False),
            "target alone + prediction": (plain, True), f"{drafter} + prediction": (spec, True)}
    totals = {name: [0, 0, 0.0] for name in ways}  # tokens, target forwards, seconds
    accepted = predicted = 0
    for task in args.tasks.split(","):
        for prompt in load_prompts(task)[: args.prompts]:  # the held-out prompts `trtspec bench` sends
            ids = tok.encode(prompt, True)
            answer = plain.generate_batch([Request(ids, args.max_tokens)])[0].token_ids
            prediction = tuple(tok.encode(edited(rng, tok.decode(answer), args.edits), False))
            for name, (decoder, predicts) in ways.items():
                request = Request(ids, args.max_tokens, prediction=prediction if predicts else ())
                decoder.generate_batch([request])  # untimed: each way's first run of this prompt
                start = time.perf_counter()
                result = decoder.generate_batch([request])[0]
                seconds = time.perf_counter() - start
                if result.token_ids != answer:
                    raise SystemExit(f"{name} changed the answer to {prompt[:40]!r}")
                totals[name][0] += len(result.token_ids)
                totals[name][1] += result.num_target_calls
                totals[name][2] += seconds
                if predicts:
                    accepted += result.num_prediction_accepted
                    predicted += result.num_predicted
    base = totals["target alone"]
    print("| way | tokens per target forward | tokens/s | vs target alone |\n|---|---:|---:|---:|")
    for name, (tokens, forwards, seconds) in totals.items():
        print(f"| {name} | {tokens / forwards:.2f} | {tokens / seconds:.1f} | "
              f"{(tokens / seconds) / (base[0] / base[2]):.2f}x |")
    print(f"\npredicted drafts accepted: {accepted} of {predicted} ({accepted / max(1, predicted):.0%}); "
          f"{args.edits} edits a prediction, {args.prompts} prompts of each of {args.tasks}, "
          f"{args.max_tokens} tokens, every answer the same as the target alone's")


if __name__ == "__main__":
    main()
