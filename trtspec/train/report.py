"""Write docs/EMBEDDED_MODEL.md: how the embedded target was trained and how well it does.

Run: `python -m trtspec.train.report [TARGET_DIR [OUT]]` (greedy continuations of held-out
prompts, arithmetic accuracy on held-out questions, the longest run of one repeated byte in code
output, the indentation written on held-out lines, held-out loss split at indentation). By default
it measures the shipped tiny-target and writes docs/EMBEDDED_MODEL.md; pointed at another stage's
weights it gives that stage's figures on the same data.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import sys
from pathlib import Path

import torch

from trtspec.config import ASSETS_DIR
from trtspec.errors import TrtspecError
from trtspec.models.target import TargetModel, load_causal_lm
from trtspec.prompts import load_prompts, math_prompts
from trtspec.spec.decoder import SpeculativeDecoder
from trtspec.tokenizer import ByteTokenizer
from trtspec.train.corpus import stdlib_text, training_corpus
from trtspec.train.overshoot import LEADING_SPACES, SPACE
from trtspec.train.pretrain import PretrainConfig, heldout_windows

LINE_SAMPLE = 200  # held-out lines of each kind (aligned, block) whose indentation is decoded


# how the embedded models are spoken to over /v1/chat/completions (trtspec.chat)
CHAT_FORMAT = (
    'The models never saw a chat transcript: their only question-and-answer text is the generated '
    'arithmetic, `Q: <question>\\nA: <worked answer>\\n`, one problem after another. The recipe writes '
    '`chat_template.jinja` beside the weights (`trtspec.train.corpus.CHAT_TEMPLATE`), which renders a'
    ' conversation in that format: each user message as `Q: <content>\\n`, each assistant message as '
    '`A: <content>\\n`, and the prompt ends with `A: ` where the answer begins; `trtspec_chat_stop` in'
    ' `config.json` (`["\\nQ:"]`) ends the reply where the corpus would start the next question. A '
    'system message has no place in that text: it is written first, on a line of its own (the model, '
    'which never saw one, may answer worse after it). `[{"role": "user", "content": "482 + 356"}]` '
    'becomes `Q: 482 + 356\\nA: ` and the greedy reply `2+6=8; 8+5=13 carry 1; 4+3+1=8; = 838` '
    "(finish_reason `stop`). Anything but arithmetic gets the model's code-like text: it is a "
    '4M-parameter model of Python sources and worked sums.'
)


def longest_run(text: str) -> int:
    return max((len(list(g)) for _, g in itertools.groupby(text)), default=0)


def indented_lines(text: bytes, block: bool) -> list[tuple[int, int]]:
    """(offset, indent) of each line indented by a multiple of 4 (`block`), or else of each line
    whose indentation is not a multiple of 4 and over 8: in the stdlib these are continuation lines
    aligned under an opening bracket."""
    found = []
    for m in LEADING_SPACES.finditer(text):
        n = len(m.group(1))
        if (n % 4 == 0) if block else (n % 4 and n > 8):
            found.append((m.start() + 1, n))
    return found


@torch.no_grad()
def clean_loss_split(model, windows: int = 128, seq_len: int = 256) -> dict[str, float]:
    """Next-byte loss (nats) on `windows` fixed windows of the held-out corpus (stdlib and
    arithmetic, stage 1's draw), split into indentation labels (a line's leading spaces and the
    byte that ends them) and the rest. Every stage is measured on the same bytes here, unlike the
    training logs, where each stage draws its held-out arithmetic with its own seed."""
    recipe = PretrainConfig()
    text = training_corpus("heldout", recipe.arithmetic_fraction, seed=recipe.seed + 1)
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    indent = torch.zeros(len(data), dtype=torch.bool)
    for m in LEADING_SPACES.finditer(text):
        indent[m.start(1) : m.end() + 1] = True
    data_w = heldout_windows(data, seq_len, windows)  # [n, t+1]
    mask = heldout_windows(indent, seq_len, windows)[:, 1:].flatten()  # [n*t]: labels at indentation
    ce = torch.cat([torch.nn.functional.cross_entropy(model(w[None, :-1]).logits[0], w[1:], reduction="none")
                    for w in data_w])  # [n*t]
    return {"all": ce.mean().item(), "indentation": ce[mask].mean().item(),
            "rest": ce[~mask].mean().item(), "indentation share": mask.float().mean().item()}


def indent_outcomes(complete_ids, text: bytes, lines: list[tuple[int, int]], context: int = 200,
                    slack: int = 40) -> dict[str, float]:
    """Greedy indentation written after `context` bytes before each line, against the
    truth: share exact, within one space, and runaway (`slack` or more spaces too many)."""
    exact = close = runaway = 0
    for offset, n in lines:
        out = complete_ids(list(text[max(0, offset - context) : offset]), n + slack)
        written = next((i for i, t in enumerate(out) if t != SPACE), len(out))  # ids, eos included
        exact += written == n
        close += abs(written - n) <= 1
        runaway += written >= n + slack
    return {k: v / len(lines) for k, v in (("exact", exact), ("within 1", close), ("runaway", runaway))}


def arithmetic_answer(question: str) -> int:
    a, op, b = re.match(r"Q: (\d+) ([-+*]) (\d+)", question).groups()
    return {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]


def main(target: Path = ASSETS_DIR / "tiny-target", out: Path = Path("docs/EMBEDDED_MODEL.md")) -> None:
    torch.manual_seed(0)
    model = load_causal_lm(target)
    tok = ByteTokenizer.from_config(model.config)
    decoder = SpeculativeDecoder(TargetModel(model), None, (tok.eos_id,))

    def complete_ids(ids: list[int], n: int) -> list[int]:
        return decoder.generate(ids, n).token_ids

    def complete(prompt: str, n: int) -> str:
        return tok.decode(complete_ids(tok.encode(prompt), n))

    names = {"+": "addition (worked column steps)", "-": "subtraction (worked borrow steps)",
             "*": "multiplication (tens/ones steps)"}

    def arithmetic_score(questions: list[str]) -> tuple[int, str]:
        by_op: dict[str, list[int]] = {}
        for q in questions:
            text = complete(q, 64).split("\nQ:")[0]
            m = re.search(r"= (-?\d+)\s*$", text.strip())
            ok = bool(m) and int(m.group(1)) == arithmetic_answer(q)
            by_op.setdefault(q.split()[2], []).append(ok)
        per_op = "; ".join(f"{names[op]} {sum(v)}/{len(v)}" for op, v in sorted(by_op.items()))
        return sum(sum(v) for v in by_op.values()), per_op

    math = load_prompts("math")
    correct, per_op = arithmetic_score(math)
    more = math_prompts(200, random.Random(7))  # a larger held-out draw, for a steadier figure
    correct_more, per_op_more = arithmetic_score(more)
    code = load_prompts("code")
    code_out = [complete(p, 160) for p in code]
    # indentation is legitimately runs of spaces; degenerate output repeats any byte far longer
    runs = [longest_run(t.replace("    ", "\t")) for t in code_out]
    worst = code_out[runs.index(max(runs))]
    heldout_code = stdlib_text("heldout")
    aligned = indented_lines(heldout_code, block=False)
    random.Random(0).shuffle(aligned)
    indent = indent_outcomes(complete_ids, heldout_code, aligned[:LINE_SAMPLE])
    regular = indented_lines(heldout_code, block=True)
    random.Random(1).shuffle(regular)
    block_indent = indent_outcomes(complete_ids, heldout_code, regular[:LINE_SAMPLE])
    split = clean_loss_split(model)

    history = json.loads((target / "training.json").read_text(encoding="utf-8"))
    draft_hist = json.loads((target.parent / "tiny-draft" / "training.json").read_text(encoding="utf-8"))
    stages = [history]
    while stages[0].get("previous_stage"):
        stages.insert(0, stages[0]["previous_stage"])
    last = history["history"][-1]
    lines = [
        "# The embedded models",
        "",
        "Trained by `trtspec train target` (recipe: `trtspec/train/pretrain.py`, corpus: "
        "`trtspec/train/corpus.py`) on this interpreter's standard-library sources plus generated "
        "arithmetic with worked steps; 1 in 10 files and questions held out by a stable hash.",
        "",
        "| model | parameters | held-out loss (nats/byte) | train loss |",
        "|---|---|---|---|",
        f"| tiny-target | {history['parameters']:,} | {last['tiny-target/heldout_loss']} | "
        f"{last['tiny-target/train_loss']} |",
        f"| tiny-draft | {draft_hist['parameters']:,} | {last['tiny-draft/heldout_loss']} | "
        f"{last['tiny-draft/train_loss']} |",
        "",
        f"Python {history['python']}, torch {history['torch']}.",
        "",
    ]
    for i, stage in enumerate(stages, 1):
        recipe = {k: v for k, v in stage["recipe"].items() if k != "init_from"}
        lines += [
            f"Stage {i} of {len(stages)}, {stage['history'][-1]['seconds'] / 60:.0f} min on 2 CPU cores; "
            f"corpus SHA-256 `{stage['corpus_sha256'][:16]}…` ({stage['corpus_bytes']['train']:,} bytes); "
            f"recipe: `{json.dumps(recipe)}`. Held-out loss during the stage (each stage draws its "
            "held-out arithmetic with its own seed; compare stages by the same-window loss under "
            "Quality):",
            "",
            "| step | target | draft |",
            "|---|---|---|",
            *[f"| {h['step']} | {h['tiny-target/heldout_loss']} | {h['tiny-draft/heldout_loss']} |"
              for h in stage["history"]],
            "",
        ]
    lines += [
        "Stage 2 is the overshoot correction (`trtspec/train/overshoot.py`). A byte-level model writes "
        "indentation one space at a time, and this one tracks the column only roughly: after stage 1, "
        "decoding the indentation of held-out continuation lines aligned under a `(` ran 40 or more "
        "spaces past the column for 70 % of the 200 measured below (exact 6 %), and one shipped code "
        "prompt decoded to 160 spaces. "
        "Past the column the model is in a state the corpus never shows. Stage 2 puts it there: a "
        "fifth of the indented lines get 1–128 extra leading spaces in the input (log-uniform), and "
        "every overshot position, the line's last real space and each inserted one, is labelled with "
        "the line's real first byte: the way back from each state the model drifts into. No label "
        "ever asks for an extra space. (A first version labelled only the last inserted space, half "
        "the lines: runaways fell to 36 % only, because the model, unable to count, met one stop label "
        "per overshoot against many real spaces.) The price is held-out loss, most of it on "
        "indentation labels, and a few more block indents ended early. Stage 1, run through this "
        "report (`python -m trtspec.train.report STAGE1/tiny-target OUT`), measured 0.8129 nats/byte "
        "on the same windows (indentation 0.3212, rest 0.9027) and block indentation exact 75.5 %, "
        "runaway 7.5 %.",
        "",
        "Reproduce every shipped model, stage 1 to the drafters: `bash scripts/train_embedded.sh`.",
        "",
        '## Chat format (`/v1/chat/completions`)',
        '',
        CHAT_FORMAT,
        '',
        "## Quality (greedy, held-out prompts; `python -m trtspec.train.report`)",
        "",
        f"- Arithmetic, the shipped math prompt set: {correct}/{len(math)} held-out questions answered "
        f"correctly: {per_op}.",
        f"- Arithmetic, {len(more)} further held-out questions: {correct_more}/{len(more)} "
        f"({correct_more / len(more):.0%}) correct: {per_op_more}.",
        f"- Code: longest run of one repeated byte (4-space indents counted as one) over "
        f"{len(code)} continuations of 160 bytes: max {max(runs)}, median {sorted(runs)[len(runs) // 2]}; "
        f"the worst continuation is `{worst!r}`.",
        f"- Code, indentation of {len(aligned[:LINE_SAMPLE])} aligned continuation lines of held-out "
        f"files (indent not a multiple of 4, written after the 200 bytes before the line): exact "
        f"{indent['exact']:.0%}, within one space {indent['within 1']:.0%}, runaway (40 or more spaces "
        f"too many) {indent['runaway']:.1%}.",
        f"- Code, block indentation (a multiple of 4) of {len(regular[:LINE_SAMPLE])} held-out lines, "
        f"the same way: exact {block_indent['exact']:.1%}, runaway {block_indent['runaway']:.1%}.",
        "- Held-out loss on the same 128 windows for every stage (`clean_loss_split`): "
        f"{split['all']:.4f} nats/byte; on indentation labels ({split['indentation share']:.1%} of "
        f"bytes) {split['indentation']:.4f}, on the rest {split['rest']:.4f}.",
        "",
        "## Sample continuations",
        "",
    ]
    for prompt in [*math[:3], *code[:3]]:
        cont = complete(prompt, 120)
        lines += ["```", prompt + "⟨" + cont + "⟩", "```", ""]
    lines.append("`⟨…⟩` marks the model's greedy continuation.")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}: arithmetic {correct}/{len(math)} and {correct_more}/{len(more)}, "
          f"max byte run {max(runs)}, aligned indentation {indent}, block indentation {block_indent}, "
          f"loss {split}", file=sys.stderr)


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m trtspec.train.report",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("target", nargs="?", type=Path, default=ASSETS_DIR / "tiny-target",
                        help="the target's checkpoint folder (default: the shipped tiny-target)")
    parser.add_argument("out", nargs="?", type=Path, default=Path("docs/EMBEDDED_MODEL.md"),
                        help="the Markdown file written (default: docs/EMBEDDED_MODEL.md, replaced)")
    args = parser.parse_args(argv)
    try:
        main(args.target, args.out)
    except TrtspecError as exc:
        parser.exit(1, f"error: {exc}\n")


if __name__ == "__main__":
    cli()
