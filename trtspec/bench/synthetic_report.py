"""What a synthetic profile's timings mean: projected speedups at published τ, and the tables.

The projection is DESIGN.md's speedup formula with the loop's own cost added:

    speedup = τ · T_AR / (T_draft + T_verify + T_overhead)

T_AR = a target forward of 1 token, T_verify = one of B tokens (the drafter's block), T_draft =
the DFlash draft step at B, T_overhead = the decode loop's per-cycle cost outside the forwards; all
at batch 1, read off the same profile. The same formula over the bandwidth floors instead of the
timings gives the speedup a bandwidth-bound implementation could reach at that τ.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec import files

# τ (tokens per target forward) and speedup over autoregressive decoding, temperature 0, batch 1.
PUBLISHED_SOURCE = ("z-lab/dflash README, Qwen3-8B-DFlash-b16, batch 1, temperature 0, one NVIDIA B200 "
                    "(the figures as quoted in trtspec issue 17)")
PUBLISHED = {
    "qwen3-8b": [("GSM8K", 6.55, 5.20), ("MATH500", 7.87, 6.17), ("HumanEval", 6.55, 5.20),
                 ("MBPP", 6.00, 4.75), ("MT-Bench", 4.25, 2.79)],
}
GRAPH_FLOOR_TARGET = 1.5  # the decode step with CUDA graphs should come within this factor of its floor


def _find(rows: list[dict], **match) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def best_ms(row: dict | None) -> float | None:
    """The graph replay's time where one was measured, else the eager one."""
    if row is None:
        return None
    return row.get("graph_ms") or row.get("eager_ms")


def _mode(*rows: dict) -> str:
    return "CUDA graphs" if all(r.get("graph_ms") for r in rows) else "eager"


def projections(result: dict) -> list[dict]:
    """Projected speedups at each published τ of `result`'s model, per context, batch 1."""
    published = PUBLISHED.get(result["model"])
    if not published:
        return []
    block, overhead = result["block_size"], result["loop_overhead"]["per_cycle_ms"]
    out = []
    for c in result["settings"]["contexts"]:
        ar = _find(result["target_forward"], batch=1, context=c, new_tokens=1)
        verify = _find(result["target_forward"], batch=1, context=c, new_tokens=block)
        draft = _find(result["draft"], batch=1, context=c, block=block)
        if not (ar and verify and draft):
            continue
        cycle_ms = best_ms(draft) + best_ms(verify) + overhead
        floor_cycle_ms = draft["floor_ms"] + verify["floor_ms"]
        for task, tau, speedup in published:
            out.append({"task": task, "tau": tau, "published_speedup": speedup, "context": c,
                        "mode": _mode(ar, verify, draft), "t_ar_ms": best_ms(ar),
                        "t_draft_ms": best_ms(draft), "t_verify_ms": best_ms(verify), "overhead_ms": overhead,
                        "projected_speedup": tau * best_ms(ar) / cycle_ms,
                        "floor_speedup": tau * ar["floor_ms"] / floor_cycle_ms})
    return out


# a forward of more new tokens timed below this share of one of fewer, same batch and context: noise
# (a busy machine, too few reps), since more tokens never take less work
INCONSISTENT_BELOW = 0.8


def inconsistencies(result: dict) -> list[str]:
    """Target forwards (same batch and context) where more new tokens timed well below fewer: the
    timings, and what is projected from them, are noise."""
    found = []
    groups: dict[tuple[int, int], list[dict]] = {}
    for row in result["target_forward"]:
        if best_ms(row) is not None:
            groups.setdefault((row["batch"], row["context"]), []).append(row)
    for (batch, context), rows in groups.items():
        rows.sort(key=lambda r: r["new_tokens"])
        slowest = rows[0]  # the slowest forward of fewer tokens so far
        for row in rows[1:]:
            ms, before = best_ms(row), best_ms(slowest)
            if ms < INCONSISTENT_BELOW * before:
                found.append(f"batch {batch}, context {context}: T({row['new_tokens']}) = {ms:.3f} ms "
                             f"< T({slowest['new_tokens']}) = {before:.3f} ms")
            if ms > before:
                slowest = row
    return found


def headline(result: dict) -> list[str]:
    """The figures the GPU run is for, one sentence each."""
    lines = []
    noisy = inconsistencies(result)
    if noisy:
        lines.append(f"**Timings inconsistent**: a forward of more tokens took under "
                     f"{INCONSISTENT_BELOW:.0%} of one of fewer ({'; '.join(noisy[:3])}"
                     f"{'; …' if len(noisy) > 3 else ''}): the "
                     "machine was busy or --reps too few; the figures and projections below are noise.")
    c, block = result["settings"]["contexts"][0], result["block_size"]
    one = _find(result["target_forward"], batch=1, context=c, new_tokens=1)
    many = _find(result["target_forward"], batch=1, context=c, new_tokens=block)
    if one and many:
        t1, tb = best_ms(one), best_ms(many)
        lines.append(f"Target forward, batch 1, context {c}: T({block}) / T(1) = {tb / t1:.2f} "
                     f"({_mode(one, many)}); T(1) = {t1:.3f} ms = {t1 / one['floor_ms']:.2f}x its floor, "
                     f"T({block}) = {tb:.3f} ms = {tb / many['floor_ms']:.2f}x its floor.")
    if one and one.get("graph_ms"):
        ratio = one["graph_ms"] / one["floor_ms"]
        verdict = "met" if ratio <= GRAPH_FLOOR_TARGET else "NOT met"
        eager = one["eager_ms"] / one["floor_ms"]
        lines.append(f"With CUDA graphs the 1-token forward is {ratio:.2f}x its floor "
                     f"(target <= {GRAPH_FLOOR_TARGET}x: {verdict}); eager it is {eager:.2f}x.")
    elif one:
        why = one.get("graph_error") or result["cuda_graphs"]
        lines.append(f"CUDA-graph decode step not measured ({why}).")
    draft = _find(result["draft"], batch=1, context=c, block=block)
    if draft and many:
        share = best_ms(draft) / best_ms(many)
        lines.append(f"DFlash draft step (B = {block}) = {share:.1%} of one target forward of {block} tokens "
                     f"(its layers alone {draft['layers_ms'] / many['eager_ms']:.1%}, eager; "
                     f"floors: {draft['floor_ms'] / many['floor_ms']:.1%}).")
    audited = result.get("capture_audit") or {}
    if audited:
        problems = [p for found in audited.values() for p in found]
        lines.append(f"CUDA-graph capture audit on the CPU ({', '.join(audited)}): "
                     + ("a capture would take each and replay it faithfully." if not problems
                        else f"{len(problems)} problem(s): " + "; ".join(problems)))
    return lines


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.1f} M"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _x(value: float | None, floor: float) -> str:
    return "-" if value is None else f"{value / floor:.2f}"


def render_markdown(result: dict) -> str:
    """One model's profile as Markdown: headline, then each table."""
    bw = result["bandwidth"]
    lines = [f"### {result['model']} on {result['device']} ({result['dtype']}, {result['scale_label']})", ""]
    lines += [f"Target: {result['target']} ({_count(result['params']['target'])} parameters); drafter: "
              f"{result['drafter']} ({_count(result['params']['drafter'])}), block {result['block_size']}. "
              f"torch {result['torch']}, transformers {result['transformers']}; started {result['started']}; "
              f"weights created on the device in {result.get('create_s', 0):.1f} s.", ""]
    floor = f"Floor = bytes moved (weights, KV, logits) / {bw['floor_gbs']:.0f} GB/s ({bw['floor_source']}"
    if bw.get("datasheet_gbs"):
        floor += f"; data sheet {bw['datasheet_gbs']:.0f} GB/s, trtspec/plan/gpus.py"
    lines += [floor + ").", ""]
    if result.get("partial"):
        lines += [f"**Partial: written while the profile ran ({result['partial']}); the run stopped "
                  "before it finished.**", ""]
    lines += [f"- {line}" for line in headline(result)] + [""]

    lines += ["| batch | context | new tokens | eager ms | graph ms | floor ms | eager/floor | graph/floor |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["target_forward"]:
        lines.append(f"| {r['batch']} | {r['context']} | {r['new_tokens']} | {_ms(r['eager_ms'])} | "
                     f"{_ms(r['graph_ms'])} | {r['floor_ms']:.3f} | {_x(r['eager_ms'], r['floor_ms'])} | "
                     f"{_x(r['graph_ms'], r['floor_ms'])} |")
    if result["hf_forward"]:
        lines += ["", "transformers' own forward with DynamicCache (a stock Hugging Face decode), eager:", "",
                  "| batch | context | new tokens | ms | static-cache eager ms |",
                  "|---:|---:|---:|---:|---:|"]
        for r in result["hf_forward"]:
            mine = _find(result["target_forward"], batch=1, context=r["context"], new_tokens=r["new_tokens"])
            lines.append(f"| 1 | {r['context']} | {r['new_tokens']} | {r['eager_ms']:.3f} | "
                         f"{_ms(mine and mine['eager_ms'])} |")
    if result.get("serving"):
        lines += ["", "The serving loop's own target (`TargetModel`, slot K/V): packed eager forward, and "
                  "the padded step of `target.cuda_graphs`:", "",
                  "| batch | context | new tokens | packed ms | padded ms | padded as | static-cache ms |",
                  "|---:|---:|---:|---:|---:|---|---:|"]
        for r in result["serving"]:
            mine = _find(result["target_forward"], batch=r["batch"], context=r["context"],
                         new_tokens=r["new_tokens"])
            lines.append(f"| {r['batch']} | {r['context']} | {r['new_tokens']} | {r['packed_ms']:.3f} | "
                         f"{_ms(r['padded_ms'])} | {r['padded']} | {_ms(best_ms(mine))} |")
    lines += ["", "DFlash draft step (context projection of B positions, block forward, LM head):", "",
              "| batch | context | B | layers ms | step eager ms | step graph ms | floor ms |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["draft"]:
        lines.append(f"| {r['batch']} | {r['context']} | {r['block']} | {r['layers_ms']:.3f} | "
                     f"{r['eager_ms']:.3f} | {_ms(r['graph_ms'])} | {r['floor_ms']:.3f} |")
    if result["plugins"]:
        lines += ["", "Plugin kernels at this model's shapes (kernel: Triton; torch: its reference):", "",
                  "| kernel | shape | dtype | kernel ms | torch ms | floor ms |",
                  "|---|---|---|---:|---:|---:|"]
        for r in result["plugins"]:
            lines.append(f"| {r['kernel']} | {r['shape']} | {r['dtype']} | {_ms(r['kernel_ms'])} | "
                         f"{r['torch_ms']:.3f} | {r['floor_ms']:.4f} |")
        if any(r["kernel_ms"] is None for r in result["plugins"]):
            from plugins.bench import KERNEL_GPU_ONLY

            lines += ["", f"Kernel column: {KERNEL_GPU_ONLY}."]
    loop = result["loop_overhead"]
    of_cycle = f" of a {loop['cycle_ms']:.3f} ms cycle" if loop.get("cycle_ms") else ""
    lines += ["", f"Decode-loop overhead per cycle: {loop['per_cycle_ms']:.3f} ms{of_cycle} ({loop['model']} "
              f"on {loop['device']}, {loop['cycles']} cycles; {loop['note']})."]
    proj = result.get("projections") or []
    if proj:
        lines += ["", f"Projected speedup at published τ ({PUBLISHED_SOURCE}); batch 1:", "",
                  "| task | τ | published | context | projected | mode | at the floors |",
                  "|---|---:|---:|---:|---:|---|---:|"]
        for p in proj:
            lines.append(f"| {p['task']} | {p['tau']:.2f} | {p['published_speedup']:.2f}x | {p['context']} | "
                         f"{p['projected_speedup']:.2f}x | {p['mode']} | {p['floor_speedup']:.2f}x |")
    if result["skipped"]:
        lines += ["", "Skipped: " + "; ".join(result["skipped"]) + "."]
    return "\n".join(lines) + "\n"


def finish(result: dict) -> dict:
    """Add the projections and the scale label to a profile from `synthetic.profile_synthetic`."""
    scale = result["settings"]["scale"]
    result["scale_label"] = "published architecture" if scale == "full" else "SMALL scaled-down shape"
    result["projections"] = projections(result)
    return result


def markdown_path(json_path: Path) -> Path:
    """Where the profile's Markdown goes beside its JSON."""
    return json_path.with_suffix(".md")


def write_outputs(result: dict, json_path: Path) -> Path:
    """Write the profile as JSON at `json_path` and as Markdown beside it (each whole or not at all);
    return the Markdown path."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(json_path, json.dumps(result, indent=1))
    md_path = markdown_path(json_path)
    files.write_text(md_path, render_markdown(result))
    return md_path
