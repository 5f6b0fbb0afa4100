"""Built-in prompt sets per task, drawn only from held-out data (never trained on).

`code`: openings of functions from held-out stdlib files; `math`: held-out arithmetic
questions; `chat`: plain-English requests. They are shipped as JSONL in
`trtspec/assets/prompts/` so every machine benchmarks the same prompts; `build_prompt_sets`
regenerates them from `train.corpus` (`python -m trtspec.prompts`).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from trtspec.config import ASSETS_DIR
from trtspec.train.corpus import _is_heldout, arithmetic_problem, arithmetic_text, stdlib_files, stdlib_text

PROMPTS_DIR = ASSETS_DIR / "prompts"
TASKS = ("code", "math", "chat")

_CHAT = [
    "Write a short note explaining what a list comprehension is.",
    "Explain how to open a file in Python and read it line by line.",
    "What does the `with` statement do?",
    "Describe the difference between a tuple and a list.",
    "How do I sort a dictionary by value?",
    "Give an example of a class with a __repr__ method.",
    "Explain what a generator is and when to use one.",
    "What is the purpose of `if __name__ == '__main__':`?",
    "How can I time a function call?",
    "Summarise what the logging module is for.",
    "Write a docstring for a function that parses a date.",
    "What happens when an exception is raised inside a try block?",
]


def load_prompts(task: str) -> list[str]:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {', '.join(TASKS)}")
    path = PROMPTS_DIR / f"{task}.jsonl"
    return [json.loads(line)["prompt"] for line in path.read_text(encoding="utf-8").splitlines() if line]


def _code_prompts(n: int, rng: random.Random) -> list[str]:
    out = []
    files = stdlib_files("heldout")
    rng.shuffle(files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        starts = [m.start() for m in re.finditer(r"^    def \w+\(self[^\n]*\n", text, re.M)]
        if not starts:
            continue
        start = rng.choice(starts)
        end = text.index("\n", start) + 1
        # the signature plus the next line gives the model something to continue
        end = text.find("\n", end) + 1 or end
        out.append(text[start:end])
        if len(out) == n:
            break
    return out


def math_prompts(n: int, rng: random.Random) -> list[str]:
    out = []
    while len(out) < n:
        question = arithmetic_problem(rng).split("\n", 1)[0]
        if _is_heldout(question):
            out.append(question + "\nA:")
    return out


def build_prompt_sets(n: int = 24, seed: int = 1234) -> dict[str, list[str]]:
    rng = random.Random(seed)
    return {"code": _code_prompts(n, rng), "math": math_prompts(n, rng), "chat": _CHAT[:n]}


def training_prompts(n: int, length: int = 64, seed: int = 99) -> list[str]:
    """`n` windows of `length` bytes from the TRAIN split, half of them from its arithmetic part,
    for drafter distillation (the target regenerates what follows each window)."""
    rng = random.Random(seed)
    code = stdlib_text("train")
    arith = arithmetic_text("train", 2_000_000, seed=seed)
    out = []
    for i in range(n):
        text = arith if i % 2 else code
        start = rng.randrange(0, len(text) - length)
        window = text[start : start + length]
        out.append(window.decode("utf-8", errors="replace"))
    return out


def write_prompt_sets(out_dir: Path = PROMPTS_DIR) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for task, prompts in build_prompt_sets().items():
        lines = [json.dumps({"task": task, "prompt": p}) for p in prompts]
        (out_dir / f"{task}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = [json.dumps({"prompt": p}) for p in training_prompts(2048)]
    (out_dir / "train-drafter.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_prompt_sets()
