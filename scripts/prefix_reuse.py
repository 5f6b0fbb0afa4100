"""What prefix reuse (`limits.prefix_reuse`) saves a multi-turn chat in the serving loop: a long
shared system prompt, then turns whose prompt is the previous prompt + its answer + the new
question, each decoded by a decoder that keeps what its slot holds and by one that prefills every
prompt whole, the two interleaved turn by turn (which goes first alternates). Per turn: the prompt
tokens, those the target actually prefilled, and the time to the first token (median over --reps
conversations, each started from empty slots). The texts must be equal: the script stops if not.

    .venv/bin/python scripts/prefix_reuse.py [--config build_configs/tiny-dflash.yaml] [--turns 5]

With --openai ON OFF it asks two running `trtspec serve` OpenAI APIs instead (one built with
limits.prefix_reuse true, one false) the same chat, by /v1/chat/completions streams: the time to
the first content chunk, and `usage.prompt_tokens_details.cached_tokens`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.config import ScheduleConfig, load_build_config  # noqa: E402
from trtspec.pipeline import load_pipeline  # noqa: E402
from trtspec.prompts import load_prompts  # noqa: E402
from trtspec.runtime import configure_threads  # noqa: E402
from trtspec.spec.decoder import Request  # noqa: E402

QUESTIONS = ["12 + 34", "34 * 8", "482 + 356", "90 - 17", "7 * 6", "15 + 27"]


def _system(chars: int) -> str:
    """A long system prompt: the shipped chat prompts, joined, cut to `chars` characters."""
    text = "Answer the arithmetic below. Examples:\n"
    pool = load_prompts("chat") + load_prompts("math")
    i = 0
    while len(text) < chars:
        text += pool[i % len(pool)] + "\n"
        i += 1
    return text[:chars]


def _turn(decoder, prompt: list[int], max_tokens: int):
    rid = decoder.add(Request(prompt, max_tokens))
    done = {}
    while decoder.lives:
        done.update(decoder.step())
    return done[rid]


def _served(urls: list[str], args, system: str) -> None:
    """The chat through two servers' OpenAI APIs (reuse on, off), turn by turn, interleaved."""
    import time

    from openai import OpenAI

    clients = {reuse: OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key="none")
               for reuse, url in zip((True, False), urls, strict=True)}
    ttft: dict[tuple[bool, int], list[float]] = {}
    rows: dict[int, tuple[int, int, int]] = {}
    for rep in range(args.reps):
        # each conversation its own from its first token: nothing held for it yet
        messages = [{"role": "system", "content": f"Conversation {rep}. {system}"}]
        for t in range(args.turns):
            messages.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
            order = (True, False) if (rep + t) % 2 == 0 else (False, True)
            texts, usage = {}, {}
            for reuse in order:
                start, first, parts = time.perf_counter(), None, []
                for chunk in clients[reuse].chat.completions.create(
                        model="trtspec", messages=messages, max_tokens=args.max_tokens, temperature=0,
                        stream=True, stream_options={"include_usage": True}):
                    if chunk.choices and chunk.choices[0].delta.content:
                        first = first or time.perf_counter() - start
                        parts.append(chunk.choices[0].delta.content)
                    if chunk.usage is not None:
                        usage[reuse] = chunk.usage
                texts[reuse] = "".join(parts)
                ttft.setdefault((reuse, t), []).append(first or 0.0)
            if texts[True] != texts[False]:
                sys.exit(f"turn {t + 1}: the served texts differ with and without reuse")
            n = usage[True].prompt_tokens
            rows[t] = (n, *(n - usage[r].prompt_tokens_details.cached_tokens for r in (True, False)))
            messages.append({"role": "assistant", "content": texts[True]})
    _table(f"served, {args.reps} conversations, max_tokens {args.max_tokens}", rows, ttft)


def _table(title: str, rows: dict[int, tuple[int, int, int]],
           ttft: dict[tuple[bool, int], list[float]]) -> None:
    print(title)
    print("| turn | prompt tokens | prefilled, reuse on | prefilled, off | TTFT on ms | TTFT off ms |")
    print("|---|---|---|---|---|---|")
    for t, (n, on, off) in rows.items():
        ms = [statistics.median(ttft[(reuse, t)]) * 1e3 for reuse in (True, False)]
        print(f"| {t + 1} | {n} | {on} | {off} | {ms[0]:.0f} | {ms[1]:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=Path("build_configs/tiny-dflash.yaml"))
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--system-chars", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--openai", nargs=2, metavar=("ON", "OFF"),
                        help="base URLs of two served OpenAI APIs: prefix reuse on, off")
    args = parser.parse_args()
    if args.openai:
        _served(args.openai, args, _system(args.system_chars))
        return
    config = load_build_config(args.config)
    configure_threads(config)
    pipeline = load_pipeline(config)
    full = ScheduleConfig(mode="full")  # whole blocks: no cost table to measure first
    decoders = {reuse: pipeline.decoder_for(1, full, prefix_reuse=reuse) for reuse in (True, False)}
    system = _system(args.system_chars)
    ttft: dict[tuple[bool, int], list[float]] = {}
    rows: dict[int, tuple[int, int, int]] = {}  # turn -> (prompt, prefilled with reuse, without)
    for rep in range(args.reps):
        for decoder in decoders.values():
            decoder.reset()
        history = pipeline.tokenizer.encode(system)
        for t in range(args.turns):
            prompt = history + pipeline.tokenizer.encode(f"\nQ: {QUESTIONS[t % len(QUESTIONS)]}\nA: ")
            order = (True, False) if (rep + t) % 2 == 0 else (False, True)
            got = {reuse: _turn(decoders[reuse], prompt, args.max_tokens) for reuse in order}
            if got[True].token_ids != got[False].token_ids:
                sys.exit(f"turn {t + 1}: the texts differ with and without reuse")
            for reuse, result in got.items():
                ttft.setdefault((reuse, t), []).append(result.prefill_s)
            rows[t] = (len(prompt), *(len(prompt) - got[reuse].cached_tokens for reuse in (True, False)))
            history = prompt + got[True].token_ids
    _table(f"{args.config.name}, drafter {pipeline.drafter.method}, {args.reps} conversations, "
           f"max_tokens {args.max_tokens}, threads {config.runtime.threads}", rows, ttft)


if __name__ == "__main__":
    main()
