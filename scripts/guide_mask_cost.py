"""What a guide costs the host at a real vocabulary's size: compiling guides, masking a verify step
of 16 positions, choosing a guided greedy block of 15 drafts, masking a 12-node tree's frontiers;
also a guide after a reasoning block (`trtspec.openai.reasoning`) while the block is written; and
a verify step with its mask filled after the target's forward or beside it, as the decoder fills it
(`SpeculativeDecoder._fill_masks`; the forward a stand-in of matrix products).

The embedded models have 264 tokens; Qwen3's tokenizer has 151,643 (151,936 ids). With no model
hub here, this trains a byte-level BPE tokenizer of that size on the Python sources of this
environment's site-packages (code, as the tiny target's text) and wraps it as a Hugging Face
tokenizer, which XGrammar reads as it reads Qwen's (`TokenizerInfo.from_huggingface`). Each
step's drafts follow a text the guide allows, tokenized by that tokenizer, so the matcher walks
real multi-byte tokens.

    python scripts/guide_mask_cost.py                  # 151,643 tokens, ~60 MB of sources
    python scripts/guide_mask_cost.py --vocab 32000    # Llama 2's size
"""

from __future__ import annotations

import argparse
import json
import random
import site
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import torch
import xgrammar as xgr
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from trtspec.openai.reasoning import REASONING, reasoning_guide
from trtspec.openai.tools import tool_plan
from trtspec.spec.grammar import Guide, GuideCompiler, GuideState, compact_json_grammar

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}, "steps": {"type": "string"}},
          "required": ["answer", "steps"]}
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
             "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
         {"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}]
STEPS = "carry the one, then add the tens: 4 + 3 + 1 = 8, so the sum is 838"
GUIDES = {  # guide, a text it allows (the drafts follow it)
    "json": (Guide("json"), json.dumps({"answer": 838, "steps": STEPS})),
    "json_schema": (Guide("json_schema", json.dumps(SCHEMA)), json.dumps({"answer": 838, "steps": STEPS})),
    "compact_schema": (Guide("ebnf_grammar", compact_json_grammar(SCHEMA)),
                       json.dumps({"answer": 838, "steps": STEPS})),
    "tool_call": (Guide(*tool_plan(TOOLS, "required", False, None).guide),
                  json.dumps([{"name": "answer", "parameters": {"answer": 838, "steps": STEPS}}])),
    "regex": (Guide("regex", r"( [0-9]+[-+*/][0-9]+=[0-9]+;)+ = [0-9]+\n"),
              " 2+6=8; 8+5=13; 4+3=7; 1+7=8; 482+356=838; 80*9=720; = 838\n"),
    # a thinking model's answer under a reasoning parser: the step's drafts lie in the reasoning block
    # (any text up to </think>), the guide's JSON after it
    "reasoning + json_schema": (Guide(*reasoning_guide(("json_schema", json.dumps(SCHEMA)), REASONING)),
                                f"The user wants the sum. {STEPS}. Check: 838 - 356 = 482.</think>\n\n"
                                + json.dumps({"answer": 838, "steps": STEPS})),
}
END = "<|endoftext|>"


def _sources(limit_mb: float):
    """Python sources of site-packages, up to `limit_mb` MB, a file at a time."""
    total = 0
    for root in site.getsitepackages():
        for path in sorted(Path(root).rglob("*.py")):
            try:
                text = path.read_text()
            except (UnicodeDecodeError, OSError):
                continue
            yield text
            total += len(text)
            if total > limit_mb * 2**20:
                return


def train_tokenizer(vocab: int, corpus_mb: float, out: Path) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer of `vocab` tokens (fewer if the corpus runs out of merges)."""
    if (out / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(out)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[END], show_progress=True,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_sources(corpus_mb), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=END)
    tokenizer.save_pretrained(out)
    return tokenizer


def _ms(work, calls: int) -> float:
    work()  # warm
    start = time.perf_counter()
    for _ in range(calls):
        work()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_643, help="tokens of the trained tokenizer")
    parser.add_argument("--corpus-mb", type=float, default=60, help="MB of sources to train it on")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/trtspec-bpe"), help="where the tokenizer "
                        "is kept between runs (a folder per size)")
    parser.add_argument("--calls", type=int, default=50, help="timed calls per figure")
    parser.add_argument("--forward-ms", type=float, default=8.0, help="the stand-in target forward's time "
                        "(the embedded target's on this CPU: about 8 ms)")
    args = parser.parse_args()

    hf = train_tokenizer(args.vocab, args.corpus_mb, args.cache / str(args.vocab))
    vocab = len(hf)
    tokenizer = SimpleNamespace(hf=hf)  # what GuideCompiler reads of trtspec's HFTokenizer
    end_ids = [hf.convert_tokens_to_ids(END)]
    start = time.perf_counter()
    compiler = GuideCompiler(tokenizer, vocab, end_ids)
    seconds = time.perf_counter() - start
    print(f"vocabulary {vocab} tokens; XGrammar's tokenizer info built in {seconds:.1f} s")
    print("| guide | compile, ms | verify step of 16 positions masked, ms | of which filling the bitmask, "
          "ms | greedy block of 15, ms | 12-node tree's frontiers (depth 4, top-3), ms |")
    print("|---|---:|---:|---:|---:|---:|")
    gen = torch.Generator().manual_seed(0)
    bitmasks = {}  # each guide's, filled along its step's drafts
    worker = ThreadPoolExecutor(1)  # as the decoder's
    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    products = max(1, round(args.forward_ms / _ms(lambda: a @ b, 20)))

    def forward() -> None:  # a target forward's stand-in: args.forward_ms of compute, the GIL let go
        for _ in range(products):
            a @ b

    forward_ms = _ms(forward, args.calls)
    overlap: list[str] = []
    for name, (guide, text) in GUIDES.items():
        start = time.perf_counter()
        compiled = compiler.compile(guide)
        compile_ms = (time.perf_counter() - start) * 1e3
        ids = hf(text, add_special_tokens=False).input_ids
        state = GuideState(compiled, end_ids, vocab)
        state.extend(ids[:2])  # a request a little way into its answer
        drafts = torch.tensor(ids[2:17])  # the step's 15 drafts follow the text
        assert len(drafts) == 15, f"the {name} text is {len(ids)} tokens; 17 needed"
        step = torch.randn(len(drafts) + 1, vocab, generator=gen)  # [s, V]
        verify = _ms(lambda: state.mask(step.clone(), drafts), args.calls)  # noqa: B023
        bitmask = state.fill(len(drafts) + 1, drafts)

        def fill(state=state, drafts=drafts) -> None:  # the grammar's part of mask
            state.fill(len(drafts) + 1, drafts)

        def sequential(state=state, step=step, drafts=drafts) -> None:  # the forward, then the mask
            forward()
            state.apply(step.clone(), state.fill(len(drafts) + 1, drafts))

        def overlapped(state=state, step=step, drafts=drafts) -> None:  # filled beside the forward
            filling = worker.submit(state.fill, len(drafts) + 1, drafts)
            forward()
            state.apply(step.clone(), filling.result())

        block = torch.randn(15, vocab, generator=gen)  # random argmaxes, mostly refused: a mask per slot
        argmaxes = block.argmax(-1).tolist()

        def choose(state=state, block=block, argmaxes=argmaxes) -> None:
            state.greedy_block(block, argmaxes)
            state.end_drafts()

        frontiers = [[tuple(drafts[:d].tolist())] * (1 if d == 0 else 3) for d in range(4)]  # 1 + 3·3 paths
        scores = torch.randn(3, vocab, generator=gen)

        def tree(frontiers=frontiers, scores=scores, state=state) -> None:
            for paths in frontiers:
                state.mask_paths(scores[: len(paths)].clone(), paths)

        print(f"| {name} | {compile_ms:.1f} | {verify:.2f} | {_ms(fill, args.calls):.2f} | "
              f"{_ms(choose, args.calls):.2f} | {_ms(tree, args.calls):.2f} |")
        bitmasks[name] = bitmask
        overlap.append(f"| {name} | {forward_ms:.2f} | {_ms(sequential, args.calls):.2f} | "
                       f"{_ms(overlapped, args.calls):.2f} |")
    print(f"\nA verify step's forward (here {args.forward_ms:g} ms of matrix products on one thread) with "
          "its mask filled after it, or beside it on the decoder's worker thread "
          "(SpeculativeDecoder._fill_masks):")
    print("| guide | forward alone, ms | forward then mask, ms | mask filled beside the forward, ms |")
    print("|---|---:|---:|---:|")
    print("\n".join(overlap))
    # the apply's time grows with the tokens a mask refuses: the regex's refuse almost all
    logits = torch.randn(16, vocab, generator=gen)
    apply = _ms(lambda: xgr.apply_token_bitmask_inplace(logits, bitmasks["regex"], vocab_size=vocab),
                args.calls)
    print(f"applying the regex step's 16-position bitmask to 16 x {vocab} float logits here: {apply:.2f} ms")
    _tool_conversion()


def _tool_conversion() -> None:
    """The frontend's side: a tool_choice "required" request's 60 tools (random schemas of 2 to 6
    properties) converted to its guide, the first time and again (the conversions are cached)."""
    rng = random.Random(0)
    kinds = [{"type": "string"}, {"type": "integer"}, {"enum": ["a", "b", "c"]},
             {"type": "array", "items": {"type": "string"}},
             {"type": "object", "properties": {"x": {"type": "boolean"}}}]
    tools = []
    for i in range(60):
        properties = {f"p{i}_{k}": rng.choice(kinds) for k in range(rng.randint(2, 6))}
        tools.append({"type": "function", "function": {"name": f"tool_{i}", "parameters": {
            "type": "object", "properties": properties, "required": list(properties)[:1]}}})
    tool_plan(tools[:1], "required", None, None)  # XGrammar's first call
    start = time.perf_counter()
    plan = tool_plan(tools, "required", None, None)
    first = (time.perf_counter() - start) * 1e3
    print(f"60 tools' required guide ({len(plan.guide[1])} characters): first {first:.1f} ms, "
          f"again {_ms(lambda: tool_plan(tools, 'required', None, None), 20):.2f} ms")


if __name__ == "__main__":
    main()
