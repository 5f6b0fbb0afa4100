"""Does the suite notice a wrong line? Small changes to one module's code (a comparison flipped, a
sign, `and`/`or`, `min`/`max`, a constant moved by one), each tried against the tests that cover it:
a change every test still passes is a survivor, where either the tests cannot tell (a gap) or the
change means the same (an equivalent mutant). Run it from the root of a clone: it rewrites the
module in place and puts it back after each mutant; changes that would not compile are never tried.

    python scripts/mutants.py trtspec/spec/verify.py tests/test_verify.py [more tests] \
        [--sample 40] [--seed 0] [--timeout 300]

The tests are pytest's arguments as given (node ids too); to pass pytest's own options, put this
script's first and everything after `--`:

    python scripts/mutants.py --sample 0 -- trtspec/spec/verify.py tests/test_verify.py -k "not slow"

`--lines 120-140,212` tries only the mutants on those lines (a rerun of a run's survivors against
slower tests, or a module audited in parts).
"""

from __future__ import annotations

import argparse
import io
import os
import random
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

SWAPS = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "+": "-", "-": "+",
         "and": "or", "or": "and", "min": "max", "max": "min", "True": "False", "False": "True",
         "is": "is not", "in": "not in", "//": "/", "*": "/"}


@dataclass(frozen=True)
class Mutant:
    line: int  # 1-based
    col: int
    old: str
    new: str

    def apply(self, lines: list[str]) -> list[str]:
        changed = list(lines)
        text = changed[self.line - 1]
        assert text[self.col:self.col + len(self.old)] == self.old
        changed[self.line - 1] = text[:self.col] + self.new + text[self.col + len(self.old):]
        return changed

    def __str__(self) -> str:
        return f"line {self.line}: {self.old!r} -> {self.new!r}"


def mutants(source: str) -> list[Mutant]:
    """Every swap on a code token outside strings, comments, imports, annotations and decorators that
    still compiles (no `for x not in`, `not not in`, `is not not`, `f(/args)`)."""
    found = []
    skip_lines: set[int] = set()
    for number, text in enumerate(source.splitlines(), 1):
        stripped = text.lstrip()
        if stripped.startswith(("import ", "from ", "@", "def ", "class ", "assert ", "raise ", "log.")):
            skip_lines.add(number)
    lines = source.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.start[0] in skip_lines or tok.type not in (tokenize.OP, tokenize.NAME, tokenize.NUMBER):
            continue
        (line, col), text = tok.start, tok.string
        if text in SWAPS:
            mutant = Mutant(line, col, text, SWAPS[text])
        elif tok.type == tokenize.NUMBER and text.isdigit() and int(text) < 4:
            mutant = Mutant(line, col, text, str(int(text) + 1))
        else:
            continue
        try:
            compile("".join(mutant.apply(lines)), "<mutant>", "exec")
        except SyntaxError:
            continue
        found.append(mutant)
    return found


def line_numbers(text: str) -> set[int]:
    """`12,40-52` -> {12, 40, 41, ..., 52}"""
    numbers: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        if not first.strip().isdigit() or not (last or first).strip().isdigit():
            raise argparse.ArgumentTypeError(f"{part!r} is not a line number or a range like 40-52")
        numbers.update(range(int(first), int(last or first) + 1))
    return numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("module", type=Path)
    parser.add_argument("tests", nargs="+")
    parser.add_argument("--sample", type=int, default=40, help="mutants tried, drawn at random (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per run of the tests")
    parser.add_argument("--lines", type=line_numbers, help="only the mutants on these lines: 12,40-52")
    args = parser.parse_args(argv)
    original = args.module.read_text()
    lines = original.splitlines(keepends=True)
    every = [m for m in mutants(original) if args.lines is None or m.line in args.lines]
    sample = len(every) if args.sample <= 0 else min(args.sample, len(every))
    chosen = random.Random(args.seed).sample(every, sample)
    chosen.sort(key=lambda m: (m.line, m.col))
    # this checkout's code first, also for the tests' own subprocesses (a venv's editable install of
    # trtspec points at the checkout it was made from, which may be another)
    path = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    pytest = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args.tests]
    # a mutant is killed when the tests fail: tests that fail, or select none, on the module as it is
    # would count every mutant killed
    first = subprocess.run(pytest, capture_output=True, text=True, timeout=args.timeout, env=env)
    if first.returncode != 0:
        print(f"the tests do not pass on {args.module} as it is (pytest exit status {first.returncode}), so "
              f"no mutant can be judged:\n{(first.stdout + first.stderr)[-2000:]}", file=sys.stderr)
        return 2
    survivors, killed, timeouts = [], 0, 0
    print(f"{args.module}: {len(every)} mutants, trying {len(chosen)} against {' '.join(args.tests)}")
    try:
        for i, mutant in enumerate(chosen, 1):
            args.module.write_text("".join(mutant.apply(lines)))
            start = time.monotonic()
            try:
                run = subprocess.run(pytest, capture_output=True, text=True, timeout=args.timeout, env=env)
                outcome = "killed" if run.returncode != 0 else "SURVIVED"
            except subprocess.TimeoutExpired:
                outcome = "timeout"  # a hang is noticed too
            if outcome == "SURVIVED":
                survivors.append(mutant)
            elif outcome == "timeout":
                timeouts += 1
            else:
                killed += 1
            took, code = time.monotonic() - start, lines[mutant.line - 1].strip()
            print(f"[{i}/{len(chosen)}] {outcome:8s} {mutant}  ({took:.0f} s)  {code}", flush=True)
    finally:
        args.module.write_text(original)
    print(f"\n{killed} killed, {timeouts} timed out, {len(survivors)} survived of {len(chosen)}")
    for mutant in survivors:
        print(f"  survivor {mutant}: {lines[mutant.line - 1].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
