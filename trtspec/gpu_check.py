"""One GPU run (`scripts/gpu_check.sh`, at most 8 minutes on an H200): parity and the cost curve.

Parity, each check guarded so one failure cannot hide the others:
- the `kv_injection_attention` torch reference and its Triton kernel (plugins/), fp32/bf16/fp16 on
  the GPU vs fp32 on the CPU; the `confidence_verify` kernels vs their torch references;
- the embedded target + DFlash drafter, greedy, token-identical to the target alone in fp32, and
  in bf16 and fp16 up to near-ties of the target's own rounding; its decode steps replayed as
  CUDA graphs (chains and draft trees) against the same loop eager;
- where TensorRT is installed, the engine flavour's engines built from the exported ONNX graphs,
  decoding like the same graphs on onnxruntime ("skipped: TensorRT not installed" elsewhere).
Then the real-size cost curve of each model (`trtspec.bench.synthetic`: target forwards eager and
as CUDA graphs against the HBM floor, DFlash draft step, plugin kernels at the model's shapes,
loop overhead, projected speedups at the published τ).

`--small` is the CPU rehearsal: the same checks at small shapes (Triton kernels in the
interpreter, a scaled-down architecture), so every import and line but the CUDA-only ones runs in
CI. Writes `gpu_check.json` and `gpu_check.md` to --out (default $OUT, else the working
directory) after every stage, so a run cut short still leaves what it measured; prints a summary
table last.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click
import torch

if TYPE_CHECKING:
    from trtspec.config import ScheduleConfig
    from trtspec.spec.metrics import GenerationResult
    from trtspec.spec.sampling import SamplingParams

log = logging.getLogger(__name__)

TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 5e-3}
MODELS = ("qwen3-8b", "llama3.1-8b")
RUN_SECONDS = 440  # the whole run on a GPU (scripts/gpu_check.sh stops it at 470)
PROFILE_BUDGET_S = {False: 300.0, True: 30.0}  # the cost curves' seconds asked by default (by --small)
PROFILE_MARGIN_S = 40  # what the cost curves need beyond their budget: loop overhead, writing
CONFIGS = Path(__file__).parents[1] / "build_configs"


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


class Stopped(BaseException):
    """SIGTERM arrived (scripts/gpu_check.sh's `timeout`): a BaseException, so that no guarded
    check or measurement takes it for its own failure and carries on."""


def _stop(signum: int, frame) -> None:
    raise Stopped(f"stopped by {signal.Signals(signum).name}")


class Run:
    """Where one check run writes: rows of parity checks, per-model profiles, the output files."""

    def __init__(self, device: torch.device, small: bool, out_dir: Path):
        self.device, self.small, self.out_dir = device, small, out_dir
        self.cuda = device.type == "cuda"
        self.rows: list[dict] = []
        self.synthetic: dict[str, dict] = {}
        self._cost_table = None
        self.started = time.strftime("%Y-%m-%d %H:%M:%S %Z")

    def timer(self, reps: int = 20):
        from trtspec.bench.device_timer import DeviceTimer

        return DeviceTimer(self.device, warmup=3, reps=reps)

    def share_cost_table(self, *pipelines) -> None:
        """Give `pipelines` (tiny DFlash, adaptive schedule) one cost model, measured by the first
        that needs it: one per dtype (the cache is keyed by it) took the CPU rehearsal past the
        script's timeout (4.5 minutes each on a shared 2-core machine), and buys the parity checks
        nothing, since no schedule changes what greedy decoding emits."""
        for pipeline in pipelines:
            if self._cost_table is None:
                self._cost_table = pipeline.cost_table
            pipeline.cost_table = self._cost_table  # a cached_property: the instance's value wins

    def guarded(self, label: str, check: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        try:
            check()
        except Exception as exc:  # report it and go on: the other checks still run
            log.exception("%s failed", label)
            self.rows.append({"check": label, "dtype": "-", "ok": False, "detail": _error(exc)})
        log.info("%s: %.1f s", label, time.perf_counter() - t0)
        self.write()

    def payload(self) -> dict:
        import transformers
        import triton

        return {"device": torch.cuda.get_device_name(self.device) if self.cuda else "cpu",
                "mode": "small (CPU rehearsal shapes)" if self.small else "full",
                "started": self.started, "torch": torch.__version__, "transformers": transformers.__version__,
                "triton": triton.__version__, "python": sys.version.split()[0],
                "rows": self.rows, "synthetic": self.synthetic}

    def write(self) -> None:
        from trtspec.bench.synthetic_report import render_markdown
        from trtspec.files import write_text  # whole or not at all: a kill between stages leaves no half file

        self.out_dir.mkdir(parents=True, exist_ok=True)
        payload = self.payload()
        write_text(self.out_dir / "gpu_check.json", json.dumps(payload, indent=1))
        lines = [f"## gpu_check on {payload['device']} ({payload['mode']})", "",
                 f"Started {payload['started']}; python {payload['python']}, torch {payload['torch']}, "
                 f"transformers {payload['transformers']}, triton {payload['triton']}.", "",
                 "| check | dtype | rel_err | ms | ok | detail |", "|---|---|---:|---:|---|---|"]
        for r in self.rows:
            err = f"{r['rel_err']:.2e}" if r.get("rel_err") is not None else ""
            ms = f"{r['ms']:.3f}" if r.get("ms") is not None else ""
            lines.append(f"| {r['check']} | {r['dtype']} | {err} | {ms} | {'yes' if r['ok'] else 'NO'} | "
                         f"{r.get('detail', '')} |")
        for result in self.synthetic.values():
            lines += ["", render_markdown(result)]
        write_text(self.out_dir / "gpu_check.md", "\n".join(lines) + "\n")


# -- parity ---------------------------------------------------------------------------------------

def check_environment(run: Run) -> None:
    import pydantic

    where = Path(pydantic.__file__).parents[1]
    run.rows.append({"check": "environment", "dtype": "-", "ok": True,
                     "detail": f"pydantic {pydantic.VERSION} from {where}; "
                     f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}"})


def check_attention(run: Run) -> None:
    from plugins.kv_injection_attention import kv_injection_attention_concat as triton_attention
    from trtspec.models.dflash import kv_injection_attention

    # the interpreter's bfloat16 dot is wrong (triton-lang/triton#11584), so the CPU runs fp32 only
    dtypes = TOLERANCE if run.cuda else {torch.float32: TOLERANCE[torch.float32]}
    shapes = [(2, 8, 2, 7, 37, 64)] if run.small else \
        [(1, 32, 8, 16, 2048, 128), (4, 16, 4, 8, 512, 64), (2, 8, 2, 7, 37, 64)]
    gen = torch.Generator().manual_seed(0)
    timer = run.timer()
    for b, h, kvh, block, ctx, d in shapes:
        q = torch.randn(b, h, block, d, generator=gen)
        k = torch.randn(b, kvh, ctx + block, d, generator=gen)
        v = torch.randn(b, kvh, ctx + block, d, generator=gen)
        ref = kv_injection_attention(q, k, v)
        for dtype, tol in dtypes.items():
            args = [t.to(run.device, dtype) for t in (q, k, v)]
            for name, fn in [("kv_injection_attention[torch]", kv_injection_attention),
                             ("kv_injection_attention[triton]", triton_attention)]:
                out = fn(*args).float().cpu()
                err = ((out - ref).norm() / ref.norm()).item()
                run.rows.append({"check": f"{name} b{b} h{h}/{kvh} B{block} ctx{ctx}",
                                 "dtype": str(dtype).removeprefix("torch."), "rel_err": err, "ok": err < tol,
                                 "ms": timer.median_ms(lambda a=args, f=fn: f(*a)) if run.cuda else None})


def check_verify(run: Run) -> None:
    """The verify kernels on the device against the torch references on the CPU: token-identical."""
    from plugins.confidence_verify import (
        draw_uniforms,
        verify_greedy,
        verify_sampling,
        verify_sampling_explicit,
    )
    from trtspec.spec.verify import verify_greedy as torch_greedy

    gen = torch.Generator().manual_seed(0)
    b, k, vocab = (4, 7, 1000) if run.small else (16, 15, 151_936)
    logits = torch.randn(b, k + 1, vocab, generator=gen)
    draft = logits.argmax(-1)[:, :k]
    flip = torch.rand(b, k, generator=gen) < 0.1
    draft[flip] = (draft[flip] + 1) % vocab
    lens = torch.randint(0, k + 1, (b,), generator=gen)
    dev = run.device
    for dtype in (torch.float32, torch.bfloat16) if run.cuda else (torch.float32,):
        want = torch_greedy(draft, logits.to(dtype).float(), lens)
        got = verify_greedy(draft.to(dev), logits.to(dtype).to(dev), lens.to(dev))
        same = torch.equal(got.tokens.cpu(), want.tokens)
        run.rows.append({"check": f"confidence_verify greedy b{b} k{k} V{vocab}", "dtype": str(dtype)[6:],
                         "ok": same, "detail": "tokens equal" if same else "TOKENS DIFFER"})
    p = torch.softmax(logits, -1)
    q = torch.softmax(logits + torch.randn(b, k + 1, vocab, generator=gen), -1)[:, :k]
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(b, k)
    u, u_last = draw_uniforms(b, k, gen)
    want = verify_sampling_explicit(draft, q, p, u, u_last, lens)
    got = verify_sampling(*(t.to(dev) for t in (draft, q, p, u, u_last, lens)))
    same = torch.equal(got.tokens.cpu(), want.tokens)
    run.rows.append({"check": f"confidence_verify sampling b{b} k{k} V{vocab}", "dtype": "float32",
                     "ok": same, "detail": "tokens equal" if same else "TOKENS DIFFER"})


def check_coupling(run: Run) -> None:
    """Gumbel coupling on the device: the fused `coupled_argmax` kernel picks the torch reference's
    tokens (computed on the CPU), and seeded sampled requests of the tiny DFlash pipeline, four at a
    time, are token for token what the target alone samples on the device."""
    from plugins.coupled_argmax import coupled_argmax
    from trtspec.spec.coupling import noise_of_keys, row_keys
    from trtspec.spec.sampling import SamplingParams

    gen = torch.Generator().manual_seed(0)
    rows, vocab = (64, 1000) if run.small else (256, 151_936)
    weights = torch.randn(rows, vocab, generator=gen) * 2
    keys = row_keys(list(range(rows)), torch.arange(rows)[:, None] + 100)[:, 0]  # [rows]
    want = (weights + noise_of_keys(keys, vocab)).argmax(-1)
    got = coupled_argmax(weights.to(run.device), keys.to(run.device)).cpu()
    same = int((got == want).sum())
    run.rows.append({"check": f"coupled_argmax {rows} rows V{vocab}", "dtype": "float32", "ok": same == rows,
                     "detail": f"{same}/{rows} rows pick the torch reference's token"})
    _batched_parity(run, "DFlash Gumbel-coupled sampling", "seeded samples identical",
                    lambda i: SamplingParams(temperature=0.8, seed=7 + i, coupling="gumbel"))


def check_penalties(run: Run) -> None:
    """Logit bias and penalties on the device (`trtspec.spec.penalties`: counts along each draft's
    path, on the device's tensors): greedy DFlash at R = 4 under them, beside unpenalized requests,
    is token for token what the target alone decodes under them on the device."""
    from trtspec.spec.sampling import SamplingParams

    penalized = SamplingParams(presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2,
                               logit_bias=((ord(" "), -1.0), (ord("e"), 1.0)))
    _batched_parity(run, "DFlash greedy under penalties", "prompts identical (every other one penalized)",
                    lambda i: penalized if i % 2 == 0 else SamplingParams())


def _batched_parity(run: Run, label: str, identical: str,
                    sampling_of: Callable[[int], SamplingParams], guide_of: Callable | None = None,
                    tree="config") -> None:
    """A row: the tiny DFlash pipeline at R = 4 decodes prompt i under `sampling_of(i)` (and the
    guide `guide_of(i)`, a `Guide` or None; drafting `tree`s: a TreeConfig, None for chains, or the
    config's) token for token as the target alone does on the device, and drafted and had drafts
    accepted (`speculation`)."""
    from trtspec.bench.loop_overhead import tiny_pipeline
    from trtspec.spec.decoder import Request

    spec = tiny_pipeline(run.device)
    run.share_cost_table(spec)
    plain = tiny_pipeline(run.device, use_drafter=False)
    prompts, max_tokens = _decoding_prompts(run, spec.tokenizer)

    def guide(i: int):
        found = None if guide_of is None else guide_of(i)
        return None if found is None else spec.guides.compile(found)

    requests = [Request(ids, max_tokens, sampling_of(i), guide=guide(i)) for i, ids in enumerate(prompts)]
    alone = [plain.decoder.generate(r.prompt, max_tokens, r.sampling, guide=r.guide).token_ids
             for r in requests]
    batch = spec.decoder_for(4, tree=tree).generate_batch(requests)
    same = sum(r.token_ids == a for r, a in zip(batch, alone, strict=True))
    counts, spoke = speculation(batch)
    run.rows.append({"check": f"{label} at R = 4 == target alone ({run.device.type})", "dtype": "float32",
                     "ok": same == len(prompts) and bool(counts["drafted"] and counts["accepted"]),
                     "detail": f"{same}/{len(prompts)} {identical}; {spoke}", **counts})


def check_guides(run: Run) -> None:
    """Guided decoding on the device (`trtspec.spec.grammar`: XGrammar's bitmasks applied to the
    device's logits, chain drafts and tree nodes guided): greedy DFlash at R = 4, every other prompt
    under a guide (a JSON schema, a regex), chains and trees, is token for token what the target
    alone decodes under the same guides; and what applying a 16-position bitmask costs on logits of
    Qwen3's vocabulary there (XGrammar's kernel on a GPU)."""
    import json

    import xgrammar as xgr

    from trtspec.config import TreeConfig
    from trtspec.spec.grammar import Guide
    from trtspec.spec.sampling import SamplingParams

    schema = {"type": "object", "properties": {"answer": {"type": "integer"}, "steps": {"type": "string"}},
              "required": ["answer", "steps"]}
    regex = r"( [0-9]+[-+*/][0-9]+=[0-9]+;)+"
    guides = (Guide("json_schema", json.dumps(schema)), None, Guide("regex", regex), None)
    for label, tree in (("DFlash greedy under guides", None),
                        ("DFlash tree greedy under guides", TreeConfig(nodes=12, topk=3))):
        _batched_parity(run, label, "prompts identical (every other one guided)", lambda i: SamplingParams(),
                        lambda i: guides[i % len(guides)], tree)
    vocab = 151_936
    logits = torch.randn(16, vocab, device=run.device)
    bitmask = torch.randint(-2**31, 2**31 - 1, (16, (vocab + 31) // 32), dtype=torch.int32,
                            generator=torch.Generator().manual_seed(0)).to(run.device)
    ms = run.timer().median_ms(lambda: xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=vocab))
    bound = 16 * vocab * 4 * 2 + bitmask.numel() * 4  # logits read and written, the bitmask read
    run.rows.append({"check": f"guide bitmask applied to 16 x V{vocab} logits ({run.device.type})",
                     "dtype": "float32", "ok": True,
                     "detail": f"{ms:.3f} ms ({bound / ms / 1e6:.0f} GB/s of logits and bitmask)"})


def _decoding_prompts(run: Run, tokenizer) -> tuple[list[list[int]], int]:
    """Code and math prompts (token ids) and the tokens to decode for each."""
    from trtspec.prompts import load_prompts

    n, max_tokens = (1, 24) if run.small else (6, 128)
    return [tokenizer.encode(p) for p in load_prompts("code")[:n] + load_prompts("math")[:n]], max_tokens


def speculation(results: Sequence[GenerationResult]) -> tuple[dict, str]:
    """What the speculative side of a parity row did, summed over its requests' `results`: drafts
    sent to the target, drafts accepted, and τ (tokens per target forward, prefill and bonus
    included); with the row's detail text, which says why the row must fail when the run never
    drafted or never accepted a draft (its output then came from the target alone, and equality
    with the target proves nothing about the draft–verify path)."""
    drafted = sum(r.num_drafted for r in results)
    accepted = sum(r.num_accepted for r in results)
    tau = sum(len(r.token_ids) for r in results) / max(1, sum(r.num_target_calls for r in results))
    counts = {"drafted": drafted, "accepted": accepted, "tau": round(tau, 3)}
    text = f"{accepted}/{drafted} drafts accepted, τ {tau:.2f}"
    if not drafted:
        text += " (FAILS: nothing drafted, the speculative path never ran)"
    elif not accepted:
        text += " (FAILS: no draft accepted, every token came from the target)"
    return counts, text


def _lossless_rows(run: Run, dtype: str, schedule: ScheduleConfig | None = None) -> None:
    """The shipped tiny target + DFlash drafter in `dtype` on the device: greedy equals the same
    target alone, one request at a time and at R = 4 (requests joining as others leave, so the
    padded steps have idle rows). Where an output differs (bfloat16 may part at a near-tie of the
    two best tokens), it passes only if every token is the target's argmax up to its rounding
    (`trtspec.spec.near_ties`). A row passes only if its speculative run drafted and had drafts
    accepted (`speculation`). `schedule`: the speculative decoders' (default the config's)."""
    from trtspec.bench.loop_overhead import tiny_pipeline
    from trtspec.spec.decoder import Request
    from trtspec.spec.near_ties import GreedyJudge, shared_prefix

    spec = tiny_pipeline(run.device, dtype=dtype)
    run.share_cost_table(spec)
    plain = tiny_pipeline(run.device, use_drafter=False, dtype=dtype)
    prompts, max_tokens = _decoding_prompts(run, spec.tokenizer)
    alone = [plain.decoder.generate(ids, max_tokens).token_ids for ids in prompts]
    decoder = spec.decoder if schedule is None else spec.decoder_for(1, schedule)
    one_results = [decoder.generate(ids, max_tokens) for ids in prompts]
    one = [r.token_ids for r in one_results]
    batch = spec.decoder_for(4, schedule).generate_batch([Request(ids, max_tokens) for ids in prompts])
    four = [r.token_ids for r in batch]
    judge = GreedyJudge(plain.config.target, plain.target)

    def verdict(outputs: list[list[int]]) -> tuple[bool, str]:
        same = sum(o == a for o, a in zip(outputs, alone, strict=True))
        audits = [judge.audit(ids, o, start=shared_prefix(o, a))
                  for ids, o, a in zip(prompts, outputs, alone, strict=True) if o != a]
        detail = f"{same}/{len(prompts)} prompts identical"
        if audits:
            worst = max(audits, key=lambda a: (not a.near_ties_only, max(a.gaps, default=0.0)))
            detail += f"; of the other {len(audits)}, " + worst.describe() + \
                ("" if len(audits) == 1 else " (the worst)")
        return all(a.near_ties_only for a in audits), detail

    how = ""  # the models' copies that decoded, with their graphs
    for name, model in (("target", decoder.target), ("drafter", decoder.drafter)):
        graphed = getattr(model, "graphed", None)
        if graphed is not None:
            how += f"; {name}: {graphed.num_steps} steps padded, " + \
                (f"capture failed: {graphed.failed}" if graphed.failed else
                 f"{len(graphed.graphs)} graphs keeping {graphed.output_bytes / 1e6:.1f} MB of outputs")
    short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[dtype]
    for label, outputs, results, extra in (("DFlash greedy", one, one_results, how),
                                           ("DFlash greedy at R = 4", four, batch, "")):
        ok, detail = verdict(outputs)
        counts, spoke = speculation(results)
        run.rows.append({"check": f"{label} == target alone ({run.device.type} {short})", "dtype": dtype,
                         "ok": ok and bool(counts["drafted"] and counts["accepted"]),
                         "detail": f"{detail}; {spoke}{extra}", **counts})


def check_decoding(run: Run) -> None:
    """Speculative decoding on the device is lossless, in float32, bfloat16 and float16."""
    for dtype in ("float32", "bfloat16", "float16"):
        _lossless_rows(run, dtype)


def check_graphs(run: Run) -> None:
    """On CUDA, the decode steps replayed as CUDA graphs decode what the same loop decodes eagerly
    (`cuda_graphs: false`), and the graphs' decode speed is measured beside the eager one. On the
    CPU, the padded steps (eager there) at R = 4 under `CaptureAudit`: what a capture would refuse
    or replay stale."""
    from trtspec.bench.loop_overhead import tiny_pipeline

    if not run.cuda:
        _audit_graphs(run)
        return
    # whole blocks in both: the adaptive schedule measures each pipeline's own costs, and two
    # measurements may pick other draft lengths, other verify shapes, other float rounding
    graphs = tiny_pipeline(run.device, schedule="full")
    eager = tiny_pipeline(run.device, cuda_graphs=False, schedule="full")
    prompts, max_tokens = _decoding_prompts(run, graphs.tokenizer)
    same = sum(graphs.decoder.generate(ids, max_tokens).token_ids
               == eager.decoder.generate(ids, max_tokens).token_ids for ids in prompts)
    speed = {}
    for label, p in (("graphs", graphs), ("eager", eager)):  # every shape captured above; prefill included
        ms = run.timer(reps=3).median_ms(lambda p=p: p.decoder.generate(prompts[0], max_tokens))
        speed[label] = max_tokens / ms * 1e3
    run.rows.append({"check": "DFlash greedy, CUDA graphs == eager (cuda fp32)", "dtype": "float32",
                     "ok": same == len(prompts),
                     "detail": f"{same}/{len(prompts)} prompts; {max_tokens} tokens of prompt 1, prefill "
                               f"included, at {speed['graphs']:.0f} tokens/s with graphs, "
                               f"{speed['eager']:.0f} eager"})
    tree_graphs, tree_eager = (p.decoder_for(1, tree=_graph_tree()) for p in (graphs, eager))
    same = sum(tree_graphs.generate(ids, max_tokens).token_ids
               == tree_eager.generate(ids, max_tokens).token_ids for ids in prompts)
    graphed = tree_graphs.target.graphed
    captured = "capture failed: " + graphed.failed if graphed.failed else \
        f"{sum(1 for *_, tree in graphed.graphs if tree)} target graphs with trees"
    run.rows.append({"check": "DFlash tree greedy, CUDA graphs == eager (cuda fp32)", "dtype": "float32",
                     "ok": same == len(prompts), "detail": f"{same}/{len(prompts)} prompts; {captured}"})


def _graph_tree():
    """A draft tree of 12 nodes (13 tokens a row: the target's tree steps fit a graph)."""
    from trtspec.config import TreeConfig

    return TreeConfig(nodes=12, topk=3)


def _audit_graphs(run: Run) -> None:
    """On the CPU: the tiny DFlash pipeline at R = 4, chains and trees, its padded steps (eager
    here) under `CaptureAudit`, against the packed steps."""
    from trtspec.bench.loop_overhead import tiny_pipeline
    from trtspec.models.graph_audit import CaptureAudit
    from trtspec.spec.decoder import Request

    eager, padded = tiny_pipeline(run.device), tiny_pipeline(run.device)
    run.share_cost_table(eager, padded)
    padded.target.cuda_graphs = padded.drafter.cuda_graphs = True  # padded on the CPU too (eagerly)
    prompts, max_tokens = _decoding_prompts(run, eager.tokenizer)
    prompts = prompts * 2  # 4 requests through R = 4: idle rows once some finish

    def decode(pipeline, tree) -> list[list[int]]:
        batch = pipeline.decoder_for(4, tree=tree).generate_batch([Request(p, max_tokens) for p in prompts])
        return [r.token_ids for r in batch]

    for label, tree in (("DFlash greedy", None), ("DFlash tree greedy", _graph_tree())):
        expected = decode(eager, tree)
        with CaptureAudit() as audit:
            got = decode(padded, tree)
        same = sum(g == e for g, e in zip(got, expected, strict=True))
        run.rows.append({"check": f"{label}, padded steps under a capture audit (cpu fp32)",
                         "dtype": "float32",
                         "ok": same == len(prompts) and not audit.problems,
                         "detail": f"{same}/{len(prompts)} prompts == packed; {audit.captures} captures, "
                                   f"{audit.replays} replays audited: "
                                   + ("; ".join(audit.problems) if audit.problems else "no problems")
                                   + " (CUDA graphs themselves: no CUDA device)"})


ENGINE_CHECKS = (("tiny-dflash", "float32"), ("tiny-dspark", "float32"), ("tiny-dflash", "float16"))


def check_engines(run: Run) -> None:
    """Where TensorRT exists: build the engine flavour's engines (plugins AOT) from the exported
    ONNX graphs and decode with them, greedy. float32: token-identical to the same graphs on
    onnxruntime. float16 (different kernels may round differently): speculation on TensorRT equals
    TensorRT decoding alone, and agreement with onnxruntime is reported."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        run.rows.append({"check": "TensorRT engines (engine flavour)", "dtype": "-", "ok": True,
                         "detail": "skipped: TensorRT not installed"})
        return
    if not run.cuda:
        run.rows.append({"check": "TensorRT engines (engine flavour)", "dtype": "-", "ok": True,
                         "detail": "skipped: no CUDA device"})
        return
    for name, dtype in ENGINE_CHECKS:
        _check_engine_config(run, name, dtype)


def _check_engine_config(run: Run, name: str, dtype: str) -> None:
    import tempfile

    from trtspec.config import load_build_config
    from trtspec.engine.build import build_engines
    from trtspec.engine.load import load_engine_models
    from trtspec.export.bundle import export_bundle
    from trtspec.prompts import load_prompts
    from trtspec.spec.decoder import SpeculativeDecoder
    from trtspec.tokenizer import ByteTokenizer

    config = load_build_config(CONFIGS / f"{name}.yaml")
    config = config.model_copy(update={"flavour": "engine",
                                        "target": config.target.model_copy(update={"dtype": dtype})})
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "engine"
        manifest = export_bundle(config, folder)
        t0 = time.perf_counter()
        build_engines(folder)
        run.rows.append({"check": f"TensorRT engine build ({name}, {len(manifest['graphs'])} graphs)",
                         "dtype": dtype, "ok": True, "ms": 1000 * (time.perf_counter() - t0)})
        decoders = {}
        for backend in ("onnxruntime", "tensorrt"):
            target, drafter, verifier = load_engine_models(config, folder=folder, backend=backend)
            tok = ByteTokenizer.from_config(target.config)
            decoders[backend] = SpeculativeDecoder(target, drafter, (tok.eos_id,), verifier)
        trt_decoder = decoders["tensorrt"]
        plain = SpeculativeDecoder(trt_decoder.target, None, (tok.eos_id,), trt_decoder.verifier)
        prompts = load_prompts("code")[:4] + load_prompts("math")[:4]
        same = lossless = 0
        tps: dict[str, list[float]] = {}
        for prompt in prompts:
            ids = tok.encode(prompt)
            out = {b: d.generate(ids, 96) for b, d in decoders.items()}
            same += out["onnxruntime"].token_ids == out["tensorrt"].token_ids
            lossless += out["tensorrt"].token_ids == plain.generate(ids, 96).token_ids
            for b, r in out.items():
                tps.setdefault(b, []).append(r.decode_tokens_per_s)
        ok = lossless == len(prompts) and (dtype != "float32" or same == len(prompts))
        run.rows.append({"check": f"engine flavour on TensorRT ({name} greedy)", "dtype": dtype, "ok": ok,
                         "detail": f"== onnxruntime {same}/{len(prompts)}, == TensorRT target alone "
                         f"{lossless}/{len(prompts)}; decode tok/s "
                         + ", ".join(f"{b} {sum(v) / len(v):.0f}" for b, v in tps.items())})


# -- the cost curve -------------------------------------------------------------------------------

def profile_models(run: Run, models: list[str], budget_s: float) -> None:
    from trtspec.bench.loop_overhead import measure_loop_overhead
    from trtspec.bench.synthetic import SyntheticSettings, profile_synthetic

    overhead: dict = {}
    max_tokens = 24 if run.small else 48
    run.guarded("decode-loop overhead",
                lambda: overhead.update(measure_loop_overhead(run.device, max_tokens=max_tokens)))
    per_model = budget_s / len(models)
    for model in models:
        settings = (SyntheticSettings.small if run.small else SyntheticSettings)(budget_s=per_model)

        def profile(m: str = model, s: SyntheticSettings = settings) -> None:
            def keep(partial: dict) -> None:  # written after each measurement: a kill keeps them
                run.synthetic[m] = partial
                run.write()

            run.synthetic[m] = profile_synthetic(m, s, run.device, overhead or None, on_progress=keep)

        run.guarded(f"synthetic profile {model}", profile)


def summary(run: Run) -> str:
    from trtspec.bench.synthetic_report import headline

    width = max([len(r["check"]) for r in run.rows] + [5])
    lines = [f"\n{'check':<{width}} {'dtype':<9} {'rel_err':>9} {'ms':>9}  ok   detail"]
    for r in run.rows:
        err = f"{r['rel_err']:.2e}" if r.get("rel_err") is not None else ""
        ms = f"{r['ms']:.3f}" if r.get("ms") is not None else ""
        ok = "yes" if r["ok"] else "NO "
        lines.append(f"{r['check']:<{width}} {r['dtype']:<9} {err:>9} {ms:>9}  {ok}  {r.get('detail', '')}")
    for model, result in run.synthetic.items():
        lines += ["", f"{model} ({result['scale_label']}, {result['device']}):"]
        lines += [f"  {line}" for line in headline(result)]
        for p in result["projections"]:
            lines.append(f"  {p['task']:<10} τ {p['tau']:.2f}  c{p['context']:<6} projected "
                         f"{p['projected_speedup']:.2f}x ({p['mode']}) vs published "
                         f"{p['published_speedup']:.2f}x")
        if result["skipped"]:
            lines.append(f"  skipped {len(result['skipped'])}: {result['skipped'][0]} ...")
    return "\n".join(lines)


CHECKS = (("environment", check_environment), ("kv_injection_attention parity", check_attention),
          ("confidence_verify parity", check_verify), ("DFlash decoding parity", check_decoding),
          ("Gumbel coupling parity", check_coupling), ("penalties parity", check_penalties),
          ("guided decoding parity", check_guides),
          ("CUDA graphs against eager", check_graphs),
          ("TensorRT engines (engine flavour)", check_engines))


def execute(run: Run, checks: Sequence[tuple[str, Callable[[Run], None]]], models: list[str],
            budget_s: float | None) -> None:
    """The parity `checks` ((label, check(run)) pairs), then the cost curves of `models`, writing
    the output files after each stage and each measurement. SIGTERM (the script's timeout) ends
    the run there with a row that says so: the files then hold what was measured until then."""
    previous = signal.signal(signal.SIGTERM, _stop)
    t0 = time.perf_counter()
    try:
        for label, check in checks:
            run.guarded(label, lambda c=check: c(run))
        if models:
            elapsed = time.perf_counter() - t0
            budget = profile_budget(budget_s, run.small, elapsed)
            if budget < (budget_s or PROFILE_BUDGET_S[run.small]):
                log.warning("cost curves get %.0f s: the checks took %.0f s", budget, elapsed)
            profile_models(run, models, budget)
    except Stopped as exc:
        log.error("%s after %.0f s; writing what was measured", exc, time.perf_counter() - t0)
        run.rows.append({"check": "run", "dtype": "-", "ok": False,
                         "detail": f"{exc} after {time.perf_counter() - t0:.0f} s: the rows and "
                                   "profiles above are what it measured until then"})
    finally:
        signal.signal(signal.SIGTERM, previous)
    run.write()


def profile_budget(asked: float | None, small: bool, elapsed: float) -> float:
    """Seconds for the cost curves: `asked` (default 300, 30 when small), on a GPU cut to what the
    run has left after `elapsed` seconds of parity checks, at least 30."""
    budget = asked or PROFILE_BUDGET_S[small]
    if small:
        return budget
    return max(30.0, min(budget, RUN_SECONDS - elapsed - PROFILE_MARGIN_S))


@click.command()
@click.option("--small", is_flag=True, help="CPU rehearsal: the same checks at small shapes.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Folder for gpu_check.json and gpu_check.md; default $OUT, else the working directory.")
@click.option("--models", default=",".join(MODELS), show_default=True,
              help="Comma-separated models for the cost curve (trtspec profile --synthetic names).")
@click.option("--budget-s", default=None, type=float,
              help="Seconds for all cost curves together; default 300 (30 with --small), cut to what "
                   "the 440-second run has left after the parity checks.")
@click.option("--parity/--no-parity", default=True, show_default=True,
              help="Run the parity checks before the cost curves; --no-parity: the cost curves alone "
                   "(a rerun in what is left of the device time).")
def main(small: bool, out_dir: Path | None, models: str, budget_s: float | None, parity: bool) -> None:
    """Parity checks and the real-size cost curve on this machine's GPU (see the module docstring)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    cuda = torch.cuda.is_available()
    if not cuda and not small:
        raise click.UsageError("no CUDA device visible; run this on a GPU node, "
                               "or add --small for the CPU rehearsal")
    if not cuda:
        # before anything imports triton (transformers does): @triton.jit reads it when it decorates
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from trtspec.bench.synthetic import resolve_model
    from trtspec.errors import TrtspecError

    names = [m.strip() for m in models.split(",") if m.strip()]
    try:
        names = [resolve_model(m).key for m in names]
    except TrtspecError as exc:
        raise click.BadParameter(str(exc), param_hint="--models") from None
    if budget_s is not None and budget_s <= 0:
        raise click.BadParameter(f"must be > 0, got {budget_s}", param_hint="--budget-s")
    run = Run(torch.device("cuda" if cuda else "cpu"), small, out_dir or Path(os.environ.get("OUT", ".")))
    execute(run, CHECKS if parity else CHECKS[:1], names, budget_s)  # the environment row always
    click.echo(summary(run))
    click.echo(f"\nwrote {run.out_dir / 'gpu_check.json'} and {run.out_dir / 'gpu_check.md'}")
    failed = [r["check"] for r in run.rows if not r["ok"]]
    if failed:
        raise click.ClickException(f"{len(failed)} check(s) failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
