"""Offline training text for the embedded byte-level models.

Two sources, both available on any machine with no download:
- the Python standard library's own sources (the interpreter running the recipe);
- generated arithmetic with worked steps (column addition with carries, subtraction,
  one-digit multiplication), so that a tiny model has something it can get *right*.

Every file and every arithmetic problem is split into `train` or `heldout` by a stable hash,
so held-out prompts used by benchmarks and drafter evaluation are never trained on.
"""

from __future__ import annotations

import hashlib
import random
import sysconfig
from pathlib import Path

HELDOUT_BUCKETS = 10  # 1 in 10 stdlib files is held out


def _is_heldout(key: str) -> bool:
    return int(hashlib.sha1(key.encode()).hexdigest(), 16) % HELDOUT_BUCKETS == 0


def stdlib_files(split: str) -> list[Path]:
    """Sorted stdlib `.py` files of this interpreter in `split` ("train" or "heldout")."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("test/", "site-packages/", "idlelib/idle_test/", "lib2to3/tests/")):
            continue
        if "/tests/" in rel or rel.startswith("tests/"):
            continue
        if _is_heldout(rel) == (split == "heldout"):
            files.append(path)
    return files


def stdlib_text(split: str) -> bytes:
    """The concatenated sources of `split`, each file separated by a blank line."""
    chunks = []
    for path in stdlib_files(split):
        data = path.read_bytes()
        if data.strip():
            chunks.append(data.rstrip() + b"\n\n")
    return b"".join(chunks)


def arithmetic_problem(rng: random.Random) -> str:
    """One problem with its worked steps, e.g. `Q: 47 + 38\\nA: 7+8=15 carry 1; 4+3+1=8; = 85\\n`
    or `Q: 63 - 18\\nA: 13-8=5 borrow 1; 6-1-1=4; = 45\\n`."""
    kind = rng.choice(["add", "add", "sub", "mul"])
    if kind == "add":
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        steps, carry = [], 0
        da, db = str(a)[::-1], str(b)[::-1]
        for i in range(max(len(da), len(db))):
            x = int(da[i]) if i < len(da) else 0
            y = int(db[i]) if i < len(db) else 0
            s = x + y + carry
            term = f"{x}+{y}" + (f"+{carry}" if carry else "")
            carry = s // 10
            steps.append(f"{term}={s}" + (" carry 1" if carry else ""))
        return f"Q: {a} + {b}\nA: {'; '.join(steps)}; = {a + b}\n"
    if kind == "sub":
        a = rng.randint(10, 999)
        b = rng.randint(1, a)
        steps, borrow = [], 0
        da, db = str(a)[::-1], str(b)[::-1]
        for i in range(len(da)):
            x = int(da[i])
            y = int(db[i]) if i < len(db) else 0
            d = x - y - borrow
            term = f"{x + 10 if d < 0 else x}-{y}" + ("-1" if borrow else "")
            borrow = int(d < 0)
            steps.append(f"{term}={d + 10 * borrow}" + (" borrow 1" if borrow else ""))
        return f"Q: {a} - {b}\nA: {'; '.join(steps)}; = {a - b}\n"
    a, b = rng.randint(11, 99), rng.randint(2, 9)
    tens, ones = (a // 10) * 10, a % 10
    return f"Q: {a} * {b}\nA: {tens}*{b} + {ones}*{b} = {tens * b} + {ones * b} = {a * b}\n"


def arithmetic_text(split: str, num_bytes: int, seed: int = 0) -> bytes:
    """About `num_bytes` of problems whose question is in `split` by the stable hash."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < num_bytes:
        problem = arithmetic_problem(rng)
        question = problem.split("\n", 1)[0]
        if _is_heldout(question) == (split == "heldout"):
            out.append(problem)
            size += len(problem)
    return "".join(out).encode()


def training_corpus(split: str, arithmetic_fraction: float = 0.2, seed: int = 0) -> bytes:
    """Stdlib code plus arithmetic making up `arithmetic_fraction` of the bytes."""
    code = stdlib_text(split)
    n_arith = int(len(code) * arithmetic_fraction / (1 - arithmetic_fraction))
    return code + arithmetic_text(split, n_arith, seed=seed)


# The chat format of the embedded models: the worked-arithmetic text above, one "Q: …" line per
# user turn and "A: …" per assistant turn; a chat turn ends where the corpus starts the next
# question. Written beside each trained model (chat_template.jinja, config `trtspec_chat_stop`)
# and documented in docs/EMBEDDED_MODEL.md.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
CHAT_STOP = ("\nQ:",)
CHAT_TEMPLATE = r"""{#- The embedded byte model's chat format: the worked-arithmetic text it was trained on
    (trtspec/train/corpus.py), "Q: <question>\nA: <answer>\n" per turn. A system message has no
    place in that text; it is written first, as a line of its own. -#}
{%- for message in messages -%}
{%- if message['role'] == 'system' -%}
{{ message['content'] }}{{ '\n' }}
{%- elif message['role'] == 'user' -%}
Q: {{ message['content'] }}{{ '\n' }}
{%- elif message['role'] == 'assistant' -%}
A: {{ message['content'] }}{{ '\n' }}
{%- else -%}
{{ raise_exception("the embedded model's chat format has no role " ~ message['role']) }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
A: {{ '' }}
{%- endif -%}
"""
