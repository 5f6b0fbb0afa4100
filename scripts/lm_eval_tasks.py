"""lm-evaluation-harness tasks on the embedded model's arithmetic, from held-out problems (questions
the recipe kept out of training, `trtspec.train.corpus`), written to --out:

- `trtspec_arith_gen` (generate_until, exact match): `Q: 47 + 38\\nA:` → the model's worked answer,
  scored on the number after its last `= `. Through a speculative server this is greedy decoding
  of the target, so its score must equal the target alone's.
- `trtspec_arith_mc` (multiple_choice, loglikelihood): the worked answer up to `=`, then the right
  result against three wrong ones (±1 in the last digit, ±10). lm-eval asks the server for the
  log-probabilities of the prompt's own tokens (`echo` with `logprobs`).

    .venv/bin/python scripts/lm_eval_tasks.py --out /tmp/lm-eval-tasks --count 100
    lm_eval --model local-completions --model_args model=trtspec,base_url=http://HOST:PORT/v1/completions \\
        --tasks trtspec_arith_gen,trtspec_arith_mc --include_path /tmp/lm-eval-tasks
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trtspec.train.corpus import _is_heldout, arithmetic_problem  # noqa: E402

GEN_TASK = """task: trtspec_arith_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 64
  do_sample: false
  temperature: 0.0
filter_list:
  - name: final-number
    filter:
      - function: regex
        regex_pattern: "= (-?\\\\d+)$"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
"""

MC_TASK = """task: trtspec_arith_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


MAX_MISSES = 200_000  # draws in a row without a new held-out problem before giving up


def documents(count: int, seed: int) -> list[dict]:
    """`count` held-out problems: question, worked answer up to `=`, the result and three wrong ones."""
    rng, docs, seen, misses = random.Random(seed), [], set(), 0
    while len(docs) < count:
        problem = arithmetic_problem(rng)
        question, answer = problem.strip().split("\n")
        if not _is_heldout(question) or question in seen:
            misses += 1
            if misses > MAX_MISSES:  # the held-out pool is spent: say so instead of drawing forever
                raise SystemExit(f"--count {count}: found only {len(docs)} distinct held-out problems "
                                 f"({MAX_MISSES:,} draws in a row gave none new); lower --count")
            continue
        misses = 0
        seen.add(question)
        worked, result = answer.rsplit("= ", 1)
        right = int(result)
        wrong = [w for w in (right + 1, right - 1, right + 10, right - 10) if w >= 0 and w != right][:3]
        choices = [str(right)] + [str(w) for w in wrong]
        order = rng.sample(range(len(choices)), len(choices))
        docs.append({"question": question.removeprefix("Q: "), "answer": str(right),
                     "context": f"{question}\n{worked}=", "choices": [choices[i] for i in order],
                     "label": order.index(0)})
    return docs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the data and task YAMLs")
    parser.add_argument("--count", type=int, default=100, help="problems per task")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "arith.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in documents(args.count, args.seed)))
    (args.out / "trtspec_arith_gen.yaml").write_text(GEN_TASK.format(data=data.resolve()))
    (args.out / "trtspec_arith_mc.yaml").write_text(MC_TASK.format(data=data.resolve()))
    print(f"wrote {args.count} problems and two tasks to {args.out}")


if __name__ == "__main__":
    main()
