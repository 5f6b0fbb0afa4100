"""Did a revision change the speedups, or did the machine? Bench two revisions side by side.

`make bench` runs take ~30 minutes and this 2-core machine's speed drifts between runs (the target
alone at R = 1 served 167.6 tokens/s in one run, 113.6 in the next), so two reports' ratios do
not tell a code change from the day. This runs the same one-request-at-a-time bench (the
concurrency phase at R = 1, every method taking turns with the target alone) at OLD and at NEW, in
alternation, ROUNDS times each (OLD NEW OLD NEW …): a difference that holds in every pair is the
code's. Each revision runs from a git worktree with this checkout's virtual environment and its own
cost-model cache; its tokens/s over the target alone's *in the same run* are what compare. Each
run's sequential table (every method decoding each prompt in turn) gives a second row per drafter,
`NAME (sequential)`, which moved less than the R = 1 rows within one session (docs/bench/revisions.md).

    python scripts/bench_revisions.py 4346d5e            # against HEAD, two rounds, ~20 min
    python scripts/bench_revisions.py 4346d5e HEAD --configs build_configs/tiny-dspark.yaml

Writes OUT/runs/<rev>-<round>/ (each bench's results) and OUT/revisions.md (the table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIGS = ["build_configs/tiny-dflash.yaml", "build_configs/tiny-draft-model.yaml"]


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout.strip()


def _resolve(rev: str) -> str:
    try:
        return _git("rev-parse", "--short", f"{rev}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"bench_revisions: {rev!r} is not a commit of {REPO}")


def _bench(tree: Path, configs: list[str], out: Path, cache: Path, prompts: int, max_tokens: int) -> dict:
    """One R = 1 bench of the checkout at `tree` -> its rows (`rows_of`)."""
    env = dict(os.environ, PYTHONPATH=str(tree), TRTSPEC_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-m", "trtspec.cli", "bench", *configs, "--tasks", "code,math,chat",
           "--prompts", str(prompts), "--max-tokens", str(max_tokens), "--concurrency", "1", "--no-hf",
           "--out", str(out)]
    log = out.with_suffix(".log")
    out.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        if subprocess.run(cmd, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT).returncode:
            sys.exit(f"bench_revisions: the bench at {tree} failed; see {log}")
    return rows_of(json.loads((out / "results.json").read_text()))


def rows_of(results: dict) -> dict:
    """A bench's results -> its concurrency methods' rows at R = 1, and each drafter's pooled speedup
    in the sequential table (`NAME (sequential)`: {"speedup": x})."""
    rows = {m: by_r["1"] for m, by_r in results["concurrency"]["methods"].items()}
    # the sequential table (each prompt decoded by every method in turn), pooled over its tasks
    tasks = results["tasks"].values()
    none_s = sum(t["none"]["seconds"] for t in tasks)
    for m in next(iter(tasks)):
        if m != "none":
            rows[f"{m} (sequential)"] = {"speedup": none_s / sum(t[m]["seconds"] for t in tasks)}
    return rows


def table(old: str, new: str, runs: list[tuple[str, dict]]) -> str:
    methods = list(runs[0][1])
    head = [f"{rev} #{i // 2 + 1}" for i, (rev, _) in enumerate(runs)]
    lines = ["| method | " + " | ".join(head) + " |", "|---|" + "---|" * len(runs)]
    for m in methods:
        cells = []
        for _, rows in runs:
            base = rows["none"]["total_tokens_per_s"]
            ratio = rows[m]["speedup"] if "speedup" in rows[m] else rows[m]["total_tokens_per_s"] / base
            cells.append(f"{base:.1f} tok/s" if m == "none" else f"{ratio:.2f}×")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return (f"# R = 1 speedups over the target alone: {old} against {new}\n\n"
            "Each column one bench (`trtspec bench CONFIGS --concurrency 1 --no-hf`), the revisions in "
            "alternation; `none` gives the target alone's tokens/s in that run, the others their "
            "steady-state tokens/s over it; `(sequential)` rows are the same run's sequential table "
            "(every method decoding each prompt in turn), pooled over its tasks.\n\n"
            + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the earlier revision (any git commit name)")
    parser.add_argument("new", nargs="?", default="HEAD", help="the later revision (default HEAD)")
    parser.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS,
                        help="build configs (paths at both revisions)")
    parser.add_argument("--rounds", type=int, default=2, help="benches per revision, alternating")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per task (make bench: 8)")
    parser.add_argument("--max-tokens", type=int, default=192, help="tokens per prompt (make bench: 192)")
    parser.add_argument("--out", type=Path, default=Path("bench-revisions"), help="folder for the results")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    old, new = _resolve(args.old), _resolve(args.new)
    if old == new:
        parser.error(f"{args.old} and {args.new} are the same commit ({old})")
    out = args.out.resolve()
    with tempfile.TemporaryDirectory(prefix="bench-revisions-") as tmp:
        trees: dict[str, Path] = {}
        try:
            for rev in (old, new):
                _git("worktree", "add", "--detach", "--quiet", str(Path(tmp) / rev), rev)
                trees[rev] = Path(tmp) / rev
            missing = [f"{cfg} at {rev}" for rev, tree in trees.items() for cfg in args.configs
                       if not (tree / cfg).is_file()]
            if missing:  # before any bench runs, not after the first revision's
                sys.exit(f"bench_revisions: no such build config: {', '.join(missing)}")
            runs = []
            for i in range(args.rounds):
                for rev in (old, new):
                    print(f"round {i + 1}/{args.rounds}: {rev}", flush=True)
                    rows = _bench(trees[rev], args.configs, out / "runs" / f"{rev}-{i + 1}",
                                  Path(tmp) / f"cache-{rev}", args.prompts, args.max_tokens)
                    runs.append((rev, rows))
        finally:
            for tree in trees.values():
                _git("worktree", "remove", "--force", str(tree))
    text = table(old, new, runs)
    (out / "revisions.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
