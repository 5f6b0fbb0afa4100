"""How far apart are two methods at R concurrent requests, beyond this machine's noise? `trtspec bench
--concurrency` measures each method once; this runs the same concurrency phase ROUNDS times in one
process with one cost table (measured once), so every round's choices are the same (the same
tokens per step) and only the timing differs, and prints each round's total tokens/s, each method's
over the target alone's, and A over B.

    python scripts/concurrency_rounds.py build_configs/tiny-dspark.yaml --concurrency 8 --rounds 3 \
        --pair dspark+adaptive,dspark+scheduler

DSpark+adaptive over its scheduler at R = 8 (2 cores, idle; each run profiles its own cost table, so
the choices differ between runs): 0.960, 0.985 and 0.956 in this command's three rounds (21.53
tokens per step against 22.93), and 1.000, 1.081 and 0.927 in an earlier run's (17.86 against
22.26). Of adaptive's gap, about 2.8 % of the run is its own planning, which the scheduler does not
do: `_draft_plan` took 0.47 ms a step at R = 8, where a replan whose step prices are memoized takes
0.18 ms (`spec.cost.admit_rows`' search 0.13 ms of it) and one that prices afresh 1.33 ms (each new
context bucket and each step's prefill size are new keys of `MeasuredCost`'s memo).
Since then a price reads only the grid rows it falls between (`SPSTable`'s `_interpolate_by`): the
same plans, pricing afresh 1.8× faster (300 plans at R = 8, 1.2 ms against 2.1 with two jobs beside
it), and `_draft_plan` at R = 8 1.09 ms a call against 1.41 in this phase on that loaded machine.
"""

from __future__ import annotations

import argparse
import statistics

from trtspec.bench.concurrency import measure_cost, run_concurrency
from trtspec.bench.run import load_methods
from trtspec.config import load_build_config, method_name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (R)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per task")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--tasks", default="code,math,chat")
    parser.add_argument("--pair", default=None, help="A,B: also print A's tokens/s over B's per round")
    args = parser.parse_args(argv)
    config = load_build_config(args.config)
    name = method_name(config)
    configs = {name: config}
    pipelines = load_methods(configs)
    table = measure_cost(pipelines[name], config, args.concurrency)
    r = str(args.concurrency)
    pair = args.pair.split(",") if args.pair else None
    ratios: dict[str, list[float]] = {}
    for i in range(args.rounds):
        res = run_concurrency(configs, args.tasks.split(","), args.prompts, args.max_tokens,
                              [args.concurrency], table=table, pipelines=pipelines)["methods"]
        none = res["none"][r]["total_tokens_per_s"]
        print(f"round {i + 1}: the target alone {none:.1f} tokens/s")
        for method, by_r in res.items():
            point = by_r[r]
            ratios.setdefault(method, []).append(point["total_tokens_per_s"] / none)
            print(f"  {method:<24} {point['total_tokens_per_s']:8.1f} tokens/s  "
                  f"{ratios[method][-1]:.3f}× none  {point['tokens_per_cycle']:6.2f} tokens/step  "
                  f"mean k {point['mean_draft_len']}")
        if pair:
            a, b = (res[m][r]["total_tokens_per_s"] for m in pair)
            ratios.setdefault(" / ".join(pair), []).append(a / b)
            print(f"  {pair[0]} / {pair[1]}: {a / b:.3f}")
    print("over the rounds (median, min-max):")
    for method, values in ratios.items():
        print(f"  {method:<40} {statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
