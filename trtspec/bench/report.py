"""Turn a benchmark's `results.json` into plots and docs/BENCHMARKS.md (`make bench`)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from trtspec.bench.interval import MIN_PROMPTS, ratio_interval  # noqa: E402
from trtspec.bench.run import check_cell, check_header, markdown_table  # noqa: E402
from trtspec.files import write_text  # noqa: E402

SPEC_METHODS_ORDER = ("dflash", "dspark", "eagle3", "draft_model")


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=120, bbox_inches="tight")  # "tight": the legend beside the axes included
    plt.close(fig)
    return path


def _colours(methods: list[str]) -> dict[str, tuple]:
    """A colour of its own for every method (matplotlib's cycle repeats after 10)."""
    cmap = plt.get_cmap("tab10" if len(methods) <= 10 else "tab20")
    return {m: cmap(i % cmap.N) for i, m in enumerate(methods)}


def _legend_beside(ax, count: int) -> None:
    """The legend right of the axes, where it hides no data however many methods there are."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, ncol=1 if count <= 16 else 2,
              frameon=False)


def _spec_methods(results: dict) -> list[str]:
    """Drafter columns, known methods first (their variants, e.g. `eagle3-k16`, `dflash+tree`, after each)."""
    rows = next(iter(results["tasks"].values()))
    drafters = [m for m in rows if m.split("+")[0] not in ("none", "hf_generate", "hf_assisted")]
    rank = {m: i for i, m in enumerate(SPEC_METHODS_ORDER)}
    return sorted(drafters, key=lambda m: (rank.get(m.split("+")[0].split("-")[0], len(rank)), m))


def plot_tau(results: dict, out: Path) -> Path:
    tasks = list(results["tasks"])
    methods = _spec_methods(results)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.8 / max(1, len(methods))
    colours = _colours(methods)
    for i, m in enumerate(methods):
        taus = [results["tasks"][t][m]["tau"] for t in tasks]
        ax.bar([x + i * width for x in range(len(tasks))], taus, width, label=m, color=colours[m])
    ax.set_xticks([x + width * (len(methods) - 1) / 2 for x in range(len(tasks))], tasks)
    ax.set_ylabel("τ (tokens per target forward)")
    _legend_beside(ax, len(methods))
    ax.set_title("Acceptance length per task")
    return _save(fig, out / "tau.png")


def plot_acceptance(results: dict, out: Path) -> Path:
    """One panel per task, a curve per method (one colour per method across the panels)."""
    tasks = list(results["tasks"])
    methods = _spec_methods(results)
    colours = _colours(methods)
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.0), sharey=True, squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        for m in methods:
            curve = results["tasks"][task][m].get("acceptance_by_position")
            if curve:  # null: no cycle offered that position; a gap in the curve, not a 0
                ys = [float("nan") if r is None else r for r in curve]
                ax.plot(range(1, len(ys) + 1), ys, marker=".", label=m, color=colours[m])
        ax.set_xlabel("draft position i")
        ax.set_title(task)
        ax.set_ylim(0, 1.02)
    axes[0][0].set_ylabel("P(accepted | offered), all steps")
    _legend_beside(axes[0][-1], len(methods))
    fig.suptitle("Acceptance by position (suffix decay)", y=1.03)
    return _save(fig, out / "acceptance_by_position.png")


def plot_block_time(results: dict, out: Path) -> Path | None:
    """Draft cost per cycle against tokens drafted: DFlash's one pass per block vs EAGLE-3's chain."""
    dflash, eagle3 = results.get("dflash_block_time_s"), results.get("eagle3_chain_time_s")
    if not dflash and not eagle3:
        return None
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for name, by_block in (dflash or {}).items():
        blocks = sorted(int(b) for b in by_block)
        ax.plot([b - 1 for b in blocks], [by_block[str(b)] * 1e3 for b in blocks], marker="o",
                label=f"{name} (one pass, block B = drafts + 1)")
    for name, by_k in (eagle3 or {}).items():
        ks = sorted(int(k) for k in by_k)
        ax.plot(ks, [by_k[str(k)] * 1e3 for k in ks], marker="s", label=f"{name} (k chained steps)")
    ax.set_xlabel("tokens drafted per cycle")
    ax.set_ylabel("draft time per cycle (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title("Draft cost vs tokens drafted (256-token context)")
    return _save(fig, out / "dflash_block_time.png")


def plot_interactivity(results: dict, out: Path) -> Path | None:
    """Tokens/s per user against total tokens/s, one curve per method, points labelled by R."""
    conc = results.get("concurrency")
    if not conc:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4))
    colours = _colours(list(conc["methods"]))
    for method, by_r in conc["methods"].items():
        rs = sorted(by_r, key=int)
        xs = [by_r[r]["per_user_tokens_per_s"] for r in rs]
        ys = [by_r[r]["total_tokens_per_s"] for r in rs]
        ax.plot(xs, ys, marker="o", label=method, color=colours[method])
        for x, y, r in zip(xs, ys, rs, strict=True):
            ax.annotate(f"R={r}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_xlabel("tokens/s per user (interactivity)")
    ax.set_ylabel("total tokens/s (throughput)")
    _legend_beside(ax, len(conc["methods"]))
    ax.set_title("Throughput vs interactivity (R concurrent requests)")
    return _save(fig, out / "interactivity.png")


def concurrency_table(conc: dict, header: str = "greedy mismatches") -> str:
    lines = ["| method | R | tokens/s per user | total tokens/s | vs none | run vs none | tokens per step | "
             f"mean k | drafts verified | {header} |", "|---|---|---|---|---|---|---|---|---|---|"]
    none = conc["methods"]["none"]
    for method, by_r in conc["methods"].items():
        for r, row in sorted(by_r.items(), key=lambda kv: int(kv[0])):
            share = "–" if row["admitted_share"] is None else f"{row['admitted_share']:.0%}"
            ratio = row["total_tokens_per_s"] / none[r]["total_tokens_per_s"]
            run = _run_ratio(row, none[r])
            lines.append(f"| {method} | {r} | {row['per_user_tokens_per_s']:.1f} | "
                         f"{row['total_tokens_per_s']:.1f} | {ratio:.2f} | {run} | "
                         f"{row['tokens_per_cycle']:.2f} | {row.get('mean_draft_len', 0.0):.1f} | {share} | "
                         f"{check_cell(row)} |")
    return "\n".join(lines)


def _run_ratio(row: dict, none: dict) -> str:
    """Whole-run tokens/s (the final drain included) over the target alone's; – where not recorded."""
    if not row.get("run_tokens_per_s") or not none.get("run_tokens_per_s"):
        return "–"
    return f"{row['run_tokens_per_s'] / none['run_tokens_per_s']:.2f}"


def adaptive_summary(conc: dict) -> list[str]:
    """Each drafter's adaptive speculation against the target alone and its best fixed setting,
    at every measured R (total tokens/s ratios from this run)."""
    methods = conc["methods"]
    lines = []
    for method in [m for m in methods if m.endswith("+adaptive")]:
        drafter = method.removesuffix("+adaptive")
        # its fixed settings: whole blocks, the prefix scheduler, thresholds (not `drafter+gumbel…`,
        # the same drafter under the other coupling)
        fixed = [m for m in methods if m == drafter or m == f"{drafter}+scheduler"
                 or m.startswith(f"{drafter}+threshold")]
        cells = []
        for r in sorted(methods[method], key=int):
            tps = methods[method][r]["total_tokens_per_s"]
            none = methods["none"][r]["total_tokens_per_s"]
            best = max([none] + [methods[m][r]["total_tokens_per_s"] for m in fixed])
            full = methods[drafter][r]["total_tokens_per_s"]
            run = _run_ratio(methods[method][r], methods["none"][r])
            cells.append(f"R={r}: full {full / none:.2f}, adaptive {tps / none:.2f}× none, "
                         f"{tps / best:.2f}× max(none, best fixed) (whole run {run}× none)")
        lines.append(f"- {drafter}: " + "; ".join(cells))
    return lines


def headline(results: dict) -> list[str]:
    """Figures pooled over all tasks: total tokens over total seconds, so long tasks weigh more; each
    speedup with its 95 % interval over the prompts (`bench.interval`) where the run has enough."""
    tasks = list(results["tasks"].values())

    def pooled(method: str, key: str) -> float:
        return sum(rows[method][key] for rows in tasks if method in rows)

    lines = ["All tasks pooled (sum of tokens / sum of seconds or target calls; in brackets the 95 % "
             "interval of a speedup, a bootstrap over each task's prompts resampled in pairs):", ""]
    none_s = pooled("none", "seconds")
    for m in _spec_methods(results):
        calls = sum(rows[m]["tokens"] / rows[m]["tau"] for rows in tasks)
        lines.append(f"- {m}: τ {pooled(m, 'tokens') / calls:.2f}, speedup over none "
                     f"{none_s / pooled(m, 'seconds'):.2f}×{_interval(tasks, 'none', m)}")
    if "hf_assisted" in tasks[0]:
        hf = pooled("hf_generate", "seconds") / pooled("hf_assisted", "seconds")
        lines.append(f"- transformers assisted generation (draft_model as assistant): {hf:.2f}× over "
                     f"transformers generate{_interval(tasks, 'hf_generate', 'hf_assisted')}")
        if "dflash" in tasks[0]:
            ours = none_s / pooled("dflash", "seconds")
            lines.append(f"- DFlash speedup / assisted-generation speedup: {ours / hf:.2f}")
    if any("lookup-pool" in m for m in _spec_methods(results)):
        lines.append("- a lookup pool (`-pool`) holds nothing here: each prompt runs alone from a reset "
                     "decoder. Its gain shows under concurrency, where each level's requests copy from "
                     "those that finished before them")
    return lines + [""]


def _interval(tasks: list[dict], base: str, method: str) -> str:
    """' [low–high×]': the interval of Σ base seconds / Σ method seconds over every task's prompts,
    resampled within each task; empty for results without per-prompt seconds (written before they
    were kept) or with too few prompts."""
    if not all("prompt_seconds" in rows[name] for rows in tasks for name in (base, method)):
        return ""
    counts = [len(rows[base]["prompt_seconds"]) for rows in tasks]
    if sum(counts) < MIN_PROMPTS or min(counts) < 2:
        return ""
    t_base = [s for rows in tasks for s in rows[base]["prompt_seconds"]]
    t_method = [s for rows in tasks for s in rows[method]["prompt_seconds"]]
    low, high = ratio_interval(t_base, t_method, [i for i, n in enumerate(counts) for _ in range(n)])
    return f" [{low:.2f}–{high:.2f}×]"


def _pooled(results: dict, method: str) -> tuple[float, float]:
    """(τ, speedup over none) of a method over all tasks: sums of tokens, target calls and seconds."""
    tasks = [rows for rows in results["tasks"].values() if method in rows]
    tokens = sum(rows[method]["tokens"] for rows in tasks)
    calls = sum(rows[method]["tokens"] / rows[method]["tau"] for rows in tasks)
    seconds = sum(rows[method]["seconds"] for rows in tasks)
    return tokens / calls, sum(rows["none"]["seconds"] for rows in tasks) / seconds


def tree_section(results: dict) -> list[str]:
    """Each drafter's tree against its own chain: τ and speedup over the target alone, per task and
    pooled (R = 1, whole blocks and trees verified)."""
    trees = results.get("trees") or {}
    if not trees:
        return []
    lines = ["## Draft trees vs chains", "",
             "Each drafter with a token tree (EAGLE-2's dynamic tree, `trtspec.spec.tree`: N draft nodes, "
             "the K best children of the K best nodes per depth, one target forward over the flattened "
             "tree) against its own chain, same prompts and budget, R = 1. For DFlash and DSpark "
             "the tree comes from the same one block forward as the chain; EAGLE-3 and draft models run "
             "one forward per depth. Speedups are over the target alone in this run.", "",
             "| drafter | tree | task | τ chain | τ tree | τ tree / chain | speedup chain | speedup tree |",
             "|---|---|---|---|---|---|---|---|"]
    for method, spec in trees.items():
        chain = method.removesuffix("+tree")
        shape = f"N={spec['nodes']}, K={spec['topk']}"
        for task, rows in results["tasks"].items():
            c, t = rows[chain], rows[method]
            lines.append(f"| {chain} | {shape} | {task} | {c['tau']:.2f} | {t['tau']:.2f} | "
                         f"{t['tau'] / c['tau']:.2f}× | {c['speedup']:.2f}× | {t['speedup']:.2f}× |")
        (tau_c, speed_c), (tau_t, speed_t) = _pooled(results, chain), _pooled(results, method)
        lines.append(f"| {chain} | {shape} | **pooled** | {tau_c:.2f} | {tau_t:.2f} | {tau_t / tau_c:.2f}× | "
                     f"{speed_c:.2f}× | {speed_t:.2f}× |")
    sized = sorted({spec["sized_by"] for spec in trees.values()})
    return lines + ["", f"Tree sizes: {'; '.join(sized)}.", ""]


def write_plots(results: dict, out_dir: Path) -> list[Path]:
    """The PNGs of this run's figures in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [p for p in (plot_tau(results, out_dir), plot_acceptance(results, out_dir),
                        plot_block_time(results, out_dir), plot_interactivity(results, out_dir)) if p]


def write_report(results: dict, plots: list[Path], command: str, doc: Path) -> None:
    """The Markdown report (`bench --doc`, e.g. docs/BENCHMARKS.md), linking `plots`."""
    doc.parent.mkdir(parents=True, exist_ok=True)
    rel = [p.relative_to(doc.parent) if p.is_relative_to(doc.parent) else p for p in plots]
    lines = [
        "# Benchmarks",
        "",
        "Generated by the command below (`make bench` runs the one of docs/BENCHMARKS.md); every figure "
        "below was measured in one run, methods interleaved "
        "prompt by prompt on the same held-out prompts and token budget, after one untimed run of the "
        "first prompt by each. Speedups are wall-time "
        "ratios against `none` (the target alone through the same loop); `hf_assisted` is against "
        f"`hf_generate`. Decoding: {results.get('decoding', 'greedy decoding')}.",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {results.get('machine', 'unknown')}",
        "",
        f"Source: trtspec at {results.get('revision') or 'an unknown revision (not a git checkout)'}",
        "",
        markdown_table(results),
        "",
        *headline(results),
        *tree_section(results),
    ]
    if "dflash_block_time_s" in results:
        lines += ["DFlash draft forward time by block size (same drafter, 256-token context, median):", ""]
        for name, by_block in results["dflash_block_time_s"].items():
            cells = ", ".join(f"B={b}: {s * 1e3:.2f} ms" for b, s in by_block.items())
            ratio = by_block["16"] / by_block["4"]
            lines.append(f"- {name}: {cells} (B=16 / B=4 = {ratio:.2f}×)")
        lines.append("")
    if "eagle3_chain_time_s" in results:
        lines += ["EAGLE-3 draft time by chain length k (same context, median):", ""]
        for name, by_k in results["eagle3_chain_time_s"].items():
            cells = ", ".join(f"k={k}: {s * 1e3:.2f} ms" for k, s in by_k.items())
            lines.append(f"- {name}: {cells} (k=15 / k=3 = {by_k['15'] / by_k['3']:.2f}×)")
        lines.append("")
    if "concurrency" in results:
        lines += ["## Concurrent requests", "",
                  "Each method serves all the prompts as R closed-loop clients would: R requests in "
                  "flight in the serving loop (one drafter pass, one packed target forward and one "
                  "verification per step for all of them), the next prompt joining as soon as one "
                  "finishes. `total tokens/s` is the steady state (tokens emitted while all R slots were "
                  "busy over that time), what a server under R clients runs; `run vs none` divides "
                  "whole-run tokens/s, the final drain at fewer than R requests included (requests that "
                  "speculation speeds up unevenly finish at different steps, so the drain is longer than "
                  "the target alone's). A drafter's own row verifies "
                  "whole blocks; `+adaptive` picks each step's draft length k ≥ 0 and the requests "
                  "that draft it from the machine's measured cost model (target time by R requests × t "
                  "tokens at the step's context, drafter time after a step's commit and its catch-up "
                  "after plain steps, the loop's own time) and each request's running acceptance, "
                  "calibrated by what recent steps got accepted (nobody drafting: plain decoding, with "
                  "a short probe now and then to learn from; DSpark drafts its whole block in the "
                  "admitted rows and Algorithm 1 cuts each from the step's confidences); `+scheduler` "
                  "is DSpark's prefix "
                  "scheduler over whole blocks, `+thresholdX` verifies the slots whose survival is at "
                  "least X. `vs none`: total tokens/s over the target alone's at the same R; `mean k`: "
                  "the drafter's draft length per step; `drafts verified`: of the drafts proposed (a "
                  "drafter's, and prompt lookup's copies), those the step sent to the target.", "",
                  concurrency_table(results["concurrency"], check_header(results)), "",
                  "Total tokens/s as a ratio to the target alone, and adaptive against the best of the "
                  "target alone and every fixed setting of the same drafter:", "",
                  *adaptive_summary(results["concurrency"]), ""]
    if "recommendation" in results:
        lines += ["## Recommendation", "", results["recommendation"], ""]
    lines += [f"![{p.stem}]({p})" for p in rel]
    write_text(doc, "\n".join(lines) + "\n")


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))
