"""What guided decoding costs speculation: τ and tokens/s of guided requests, side by side.

The verifier masks the target's p with each request's guide at every draft position
(`trtspec.spec.grammar`). This decodes each held-out prompt under five guides (any JSON, a JSON
schema, the same schema written compactly as tool calls' guides are, the guide of a tool call
under tool_choice "required", and a regular expression in the task's own style), greedy, whole
blocks, interleaved prompt by prompt: the target alone and speculation, each guided and unguided,
and prints τ and the pooled tokens/s.

    python scripts/guide_tau.py build_configs/tiny-dflash.yaml --prompts 4
    python scripts/guide_tau.py build_configs/tiny-dflash.yaml --concurrency 8   # all prompts 8 at a time
    python scripts/guide_tau.py build_configs/tiny-eagle3.yaml --tree 12,3   # trees: 12 nodes, top-3
"""

from __future__ import annotations

import argparse
import json
import time

from trtspec.config import ScheduleConfig, TreeConfig, load_build_config
from trtspec.openai.tools import tool_plan
from trtspec.pipeline import load_pipeline
from trtspec.prompts import load_prompts
from trtspec.runtime import configure_threads
from trtspec.spec.decoder import Request, SpeculativeDecoder
from trtspec.spec.grammar import Guide, compact_json_grammar

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "steps": {"type": "string"}},
          "required": ["answer", "steps"]}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}]
REGEX = {  # each task's answers in the shape the tiny target writes them
    "math": r"( [0-9]+[-+*/][0-9]+=[0-9]+;)+ = [0-9]+\n",
    "code": r"(    [a-z_.]+ = [^\n]+\n)+",
    "chat": r" [A-Z][a-z ,']+\.( [A-Z][a-z ,']+\.)*\n",
}


def _guides(task: str) -> dict[str, Guide | None]:
    return {"unguided": None, "json": Guide("json"), "json_schema": Guide("json_schema", json.dumps(SCHEMA)),
            "compact_schema": Guide("ebnf_grammar", compact_json_grammar(SCHEMA)),
            "tool_call": Guide(*tool_plan(TOOLS, "required", False, None).guide),
            "regex": Guide("regex", REGEX[task])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="build config of the target and drafter")
    parser.add_argument("--tasks", default="code,math,chat", help="held-out prompt sets")
    parser.add_argument("--prompts", type=int, default=4, help="prompts per task")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="R > 1: each guide's requests served R at a time (continuous batching), the "
                             "target alone and speculation one after the other")
    parser.add_argument("--schedule", choices=("full", "config"), default="full",
                        help="whole blocks, or the config's drafter.schedule (adaptive: the cost model "
                             "picks k)")
    parser.add_argument("--tree", default=None, metavar="NODES,TOPK",
                        help="draft trees of NODES nodes, each node's TOPK best children (default: the "
                             "config's drafter.tree, chains without one)")
    args = parser.parse_args()

    config = load_build_config(args.config)
    configure_threads(config)
    pipeline = load_pipeline(config)
    schedule = ScheduleConfig(mode="full") if args.schedule == "full" else None  # None: the config's
    # no prefix reuse: each prompt runs once per guide, and a reused prefill would favour the later ones
    tree = "config"
    if args.tree is not None:
        nodes, topk = map(int, args.tree.split(","))
        tree = TreeConfig(nodes=nodes, topk=topk)
    spec = pipeline.decoder_for(args.concurrency, schedule, tree=tree, prefix_reuse=False)
    alone = SpeculativeDecoder(spec.target, None, spec.end_ids, max_slots=args.concurrency)
    ways = {"target alone": alone, "speculation": spec}
    kinds = tuple(_guides("math"))
    totals = {(way, kind): [0, 0, 0.0] for way in ways for kind in kinds}  # tokens, forwards, seconds
    ended = dict.fromkeys(kinds[1:], 0)
    prompts = [(task, p) for task in args.tasks.split(",") for p in load_prompts(task)[: args.prompts]]
    spec.generate(pipeline.tokenizer.encode(prompts[0][1]), 16)  # one untimed run each
    alone.generate(pipeline.tokenizer.encode(prompts[0][1]), 16)
    for task, prompt in prompts if args.concurrency == 1 else ():
        ids = pipeline.tokenizer.encode(prompt)
        for kind, guide in _guides(task).items():
            compiled = None if guide is None else pipeline.guides.compile(guide)
            texts = {}
            for way, decoder in ways.items():
                start = time.perf_counter()
                result = decoder.generate(ids, args.max_tokens, guide=compiled)
                seconds = time.perf_counter() - start
                texts[way] = result.token_ids
                total = totals[way, kind]
                total[0] += len(result.token_ids)
                total[1] += result.num_target_calls
                total[2] += seconds
            assert texts["speculation"] == texts["target alone"], (prompt, kind)
            if guide is not None:
                ended[kind] += result.finish_reason == "stop"
    for kind in kinds if args.concurrency > 1 else ():
        requests = []
        for task, prompt in prompts:
            guide = _guides(task)[kind]
            requests.append(Request(pipeline.tokenizer.encode(prompt), args.max_tokens,
                                    guide=None if guide is None else pipeline.guides.compile(guide)))
        texts = {}
        for way, decoder in ways.items():
            start = time.perf_counter()
            results = decoder.generate_batch(requests)
            total = totals[way, kind]
            total[2] += time.perf_counter() - start
            total[0] += sum(len(r.token_ids) for r in results)
            total[1] += sum(r.num_target_calls for r in results)
            texts[way] = [r.token_ids for r in results]
        assert texts["speculation"] == texts["target alone"], kind
        if kind != "unguided":
            ended[kind] += sum(r.finish_reason == "stop" for r in results)
    shape = "chains" if spec.tree is None else f"trees of {spec.tree.nodes} nodes, top-{spec.tree.topk}"
    print(f"R = {args.concurrency}, schedule {spec.schedule.mode}, {shape}; {len(prompts)} prompts, "
          f"{args.max_tokens} tokens each; guided texts that "
          f"ended (the rest hit max_tokens): {', '.join(f'{k} {n}' for k, n in ended.items())}")
    print("| guide | τ | speculation tokens/s | target alone tokens/s | speedup |")
    print("|---|---:|---:|---:|---:|")
    for kind in kinds:
        tokens, forwards, seconds = totals["speculation", kind]
        base = totals["target alone", kind]
        print(f"| {kind} | {tokens / forwards:.2f} | {tokens / seconds:.1f} | {base[0] / base[2]:.1f} | "
              f"{(tokens / seconds) / (base[0] / base[2]):.2f}× |")


if __name__ == "__main__":
    main()
