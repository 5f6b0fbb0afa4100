"""`trtspec bench` on a tiny run: well-formed results, real PNGs, speedups from this run's timings."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.provenance import source_revision

from .conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_tiny_bench(tmp_path):
    configs = [str(REPO / "build_configs" / f"{n}.yaml") for n in ("tiny-dflash", "tiny-draft-model")]
    # an earlier run's figure that this run (no --concurrency) does not draw, and a file of the user's
    (tmp_path / "interactivity.png").write_bytes(PNG_MAGIC)
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(main, ["bench", *configs, "--tasks", "code,math", "--prompts", "1",
                                       "--max-tokens", "24", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    # the stale figure was kept beside these results; the run's own outputs replace all of an earlier
    # run's, and nothing else (no staging folder) is left
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "acceptance_by_position.png", "dflash_block_time.png", "notes.txt", "results.json", "results.md",
        "tau.png"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["tasks"]) == {"code", "math"}
    for rows in results["tasks"].values():
        assert set(rows) == {"none", "dflash", "draft_model", "hf_generate", "hf_assisted"}
        for name, row in rows.items():
            assert row["greedy_mismatches"] == 0, name
            assert row["tokens"] == rows["none"]["tokens"]
            base = rows["hf_generate" if name == "hf_assisted" else "none"]
            # the speedup is the ratio of the two timings recorded in this very run
            assert abs(row["speedup"] - base["seconds"] / row["seconds"]) < 0.01 * row["speedup"] + 1e-3
            # each prompt's own seconds, what the pooled speedups' intervals resample (one prompt a task)
            assert len(row["prompt_seconds"]) == 1
            assert row["prompt_seconds"][0] == pytest.approx(row["seconds"], abs=1e-5)
        assert len(rows["dflash"]["acceptance_by_position"]) == 15
        assert rows["none"]["tau"] == 1.0 and rows["dflash"]["tau"] > 1.0
    for png in ("tau.png", "acceptance_by_position.png", "dflash_block_time.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC
    assert sorted(p.name for p in tmp_path.glob("*.md")) == ["results.md"]  # no report without --doc


def test_tiny_concurrency_bench_and_recommendation(tmp_path):
    configs = [str(REPO / "build_configs" / f"{n}.yaml") for n in ("tiny-dflash", "tiny-dspark")]
    sps = tmp_path / "sps.json"
    sps.write_text("{}")  # an earlier run's: replaced (`make bench` rewrites its report the same way)
    prof = CliRunner().invoke(main, ["profile", configs[0], "--out", str(sps), "--batches", "1,4,16",
                                     "--requests", "2", "--context", "16", "--reps", "2"])
    assert prof.exit_code == 0, prof.output
    table = json.loads(sps.read_text())
    assert table["drafter"] == "dflash" and table["draft_lens"] == [15]
    assert len(table["draft_seconds"]) == len(table["draft_batches"]) == 2  # R = 1, 2
    # the target also timed by shape: R = 1, 2 requests × t = 1 … k + 1 tokens each
    assert table["verify_rows"] == [1, 2] and table["verify_tokens_per_row"] == [1, 2, 3, 4, 6, 8, 12, 16]
    assert [len(row) for row in table["verify_steps_per_s"]] == [8, 8]
    doc = tmp_path / "docs" / "bench" / "BENCHMARKS.md"  # --doc in folders not made yet: made
    result = CliRunner().invoke(main, ["bench", *configs, "--tasks", "code,math", "--prompts", "2",
                                       "--max-tokens", "16", "--no-hf", "--concurrency", "1,2",
                                       "--sps", str(sps), "--out", str(tmp_path), "--doc", str(doc)])
    assert result.exit_code == 0, result.output
    conc = json.loads((tmp_path / "results.json").read_text())["concurrency"]
    assert {"none", "dflash", "dflash+adaptive", "dspark", "dspark+adaptive", "dspark+scheduler",
            "dspark+threshold0.5"} <= set(conc["methods"])
    for method, by_r in conc["methods"].items():
        assert set(by_r) == {"1", "2"}
        for row in by_r.values():
            assert row["greedy_mismatches"] == 0, method
            assert row["tokens"] == by_r["1"]["tokens"]  # same prompts, same budget, same text
            assert row["run_tokens_per_s"] == pytest.approx(row["tokens"] / row["wall_s"], rel=0.01)
            steady = row["steady_tokens"] / row["steady_s"]
            assert row["total_tokens_per_s"] == pytest.approx(steady, rel=0.01)
            assert 0 < row["steady_tokens"] <= row["tokens"]
        assert by_r["1"]["steady_tokens"] == by_r["1"]["tokens"]  # one client: no drain at the end
    # the recommendation names a measured setting, with that setting's own figures
    text = json.loads((tmp_path / "results.json").read_text())["recommendation"]
    best = max(((m, r, row) for m, by_r in conc["methods"].items() for r, row in by_r.items()
                if row["per_user_tokens_per_s"] >= conc["methods"]["none"]["1"]["per_user_tokens_per_s"]),
               key=lambda t: t[2]["total_tokens_per_s"])
    assert f"**{best[0]}** at concurrency {best[1]}" in text
    assert (tmp_path / "interactivity.png").read_bytes()[:8] == PNG_MAGIC
    report = doc.read_text()  # --doc: the Markdown report, and only there
    assert "## Recommendation" in report and "| code | dflash |" in report and "B=16 / B=4" in report
    assert not (tmp_path / "BENCHMARKS.md").exists()
    bad = CliRunner().invoke(main, ["bench", configs[0], "--concurrency", "1,x", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "--concurrency" in bad.output


def test_bench_methods_share_one_loaded_target_and_refuse_another(tmp_path):
    """`load_methods` loads the target's weights once for `none` and every method (each pipeline
    keeps its own slots and taps), and `bench` refuses configs whose targets differ, naming both,
    before loading anything: each method is timed and judged against one target alone."""
    import yaml

    from trtspec.bench.run import load_methods
    from trtspec.config import load_build_config

    configs = {n: load_build_config(REPO / "build_configs" / f"tiny-{n}.yaml") for n in ("dflash", "dspark")}
    pipelines = load_methods(configs)
    assert len({id(p.target.model) for p in pipelines.values()}) == 1
    assert len({id(p.target) for p in pipelines.values()}) == 3
    assert pipelines["none"].target.taps is None and pipelines["dflash"].target.taps is not None
    other = yaml.safe_load((REPO / "build_configs" / "tiny-dspark.yaml").read_text())
    other["target"]["dtype"] = "bfloat16"
    (tmp_path / "bf16.yaml").write_text(yaml.safe_dump(other))
    result = CliRunner().invoke(main, ["bench", str(REPO / "build_configs" / "tiny-dflash.yaml"),
                                       str(tmp_path / "bf16.yaml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "(dspark) has target" in result.output, result.output
    assert "bfloat16" in result.output and "float32" in result.output and "share it" in result.output
    assert not (tmp_path / "out").exists()


def test_serve_stream_refills_slots_and_measures_the_steady_state():
    """R = 2 clients over requests of 4, 8 and 2 tokens (target alone: one token per request per
    step): the third joins when the first finishes, and the steady state ends with the third, when
    no request is left to fill its slot (4 + 6 + 2 tokens emitted by then, 14 in the whole run)."""
    from trtspec.bench.concurrency import serve_stream
    from trtspec.config import ScheduleConfig, load_build_config
    from trtspec.pipeline import load_pipeline
    from trtspec.spec.decoder import Request

    config = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    pipeline = load_pipeline(config, use_drafter=False)
    decoder = pipeline.decoder_for(2, ScheduleConfig(mode="full"))
    prompt = pipeline.tokenizer.encode("def f(x):")
    joined = []
    add = decoder.add
    decoder.add = lambda request, on_tokens=None: joined.append(decoder.num_steps) or add(request, on_tokens)
    requests = [Request(prompt, n, end_id=-1) for n in (4, 8, 2)]  # no end id: each runs its budget
    results, steady, whole = serve_stream(decoder, requests, 2)
    assert [len(r.token_ids) for r in results] == [4, 8, 2]
    assert joined == [0, 0, 4]  # the third joins in the step after the first's last token
    assert (steady[1], whole[1]) == (12, 14) and 0 < steady[0] <= whole[0]


def test_each_method_runs_once_untimed_before_its_timed_prompts(monkeypatch):
    """A method's first call pays one-time costs (on the tiny target, 64 tokens: the target alone
    1374 ms on its first call, 1122 and 1145 ms after; dflash 703, then 609 and 616); the bench runs
    the first prompt once per method before timing, and only the timed runs are counted."""
    from trtspec.bench.run import run_bench
    from trtspec.config import load_build_config
    from trtspec.spec.decoder import SpeculativeDecoder

    calls: list[int] = []
    generate = SpeculativeDecoder.generate

    def counted(self, *args, **kwargs):
        calls.append(id(self))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", counted)
    config = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    results = run_bench({"dflash": config}, ["math", "code"], 1, 6, hf_reference=False)
    assert len(set(calls)) == 2 and all(calls.count(d) == 1 + 2 for d in set(calls))  # none, dflash
    assert calls[0] != calls[1] and calls[2:4] == calls[:2]  # a warm-up per method, then the timed runs
    for rows in results["tasks"].values():
        assert rows["none"]["tokens"] == rows["dflash"]["tokens"] <= 6  # one timed prompt per task


def test_one_token_requests_have_no_per_user_speed():
    """A request of one token has no time after its first: it is left out of the per-user mean
    (it used to count as 0 tokens/s, halving the mean of a run of two requests)."""
    from trtspec.bench.concurrency import StreamRun
    from trtspec.config import ScheduleConfig, load_build_config
    from trtspec.pipeline import load_pipeline
    from trtspec.spec.decoder import Request

    config = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    pipeline = load_pipeline(config, use_drafter=False)
    prompt = pipeline.tokenizer.encode("def f(x):")
    run = StreamRun(pipeline.decoder_for(2, ScheduleConfig(mode="full")),
                    [Request(prompt, n, end_id=-1) for n in (1, 8)], 2)
    while not run.done:
        run.advance(4)
    assert [len(r.token_ids) for r in run.results] == [1, 8]
    assert len(run.user_tps) == 1 and run.user_tps[0] > 0


def test_tree_rows_compare_each_drafter_with_its_chain(tmp_path):
    """--tree N,K adds NAME+tree for each drafter method (one per method), token-identical to the
    target; the report's tree section sets its τ and speedup beside the chain's."""
    configs = [str(REPO / "build_configs" / f"{n}.yaml") for n in ("tiny-dflash", "tiny-eagle3")]
    doc = tmp_path / "report.md"
    doc.write_text("an earlier run's report\n")  # replaced, as `make bench` replaces docs/BENCHMARKS.md
    result = CliRunner().invoke(main, ["bench", *configs, "--tasks", "code", "--prompts", "1",
                                       "--max-tokens", "24", "--no-hf", "--tree", "8,2",
                                       "--out", str(tmp_path), "--doc", str(doc)])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    rows = results["tasks"]["code"]
    assert set(rows) == {"none", "dflash", "eagle3", "dflash+tree", "eagle3+tree"}
    assert all(row["greedy_mismatches"] == 0 for row in rows.values())
    assert results["trees"]["dflash+tree"]["nodes"] == 8 and results["trees"]["eagle3+tree"]["topk"] == 2
    report = doc.read_text()
    assert "an earlier run's report" not in report
    assert results["revision"] == source_revision() and f"Source: trtspec at {source_revision()}" in report
    tau = rows["dflash+tree"]["tau"] / rows["dflash"]["tau"]
    assert "## Draft trees vs chains" in report and "| dflash | N=8, K=2 | code |" in report
    assert f"{tau:.2f}×" in report
    for bad, message in (("8", "expected auto or N,K"),
                         ("0,2", "values must be >= 1"),
                         ("300,2", "nodes: Input should be less than or equal to 256")):
        out = CliRunner().invoke(main, ["bench", configs[0], "--tree", bad, "--out", str(tmp_path)])
        assert out.exit_code == 2 and "--tree" in out.output and message in out.output, out.output


def test_profile_times_a_catch_up_longer_than_its_prompts():
    """A profile of one short request (8 cached tokens) still times a 32-position catch-up: the
    taps it commits repeat the prompts' (it once raised from inside the drafter)."""
    from trtspec.bench.profile import profile_cost
    from trtspec.config import load_build_config
    from trtspec.pipeline import load_pipeline

    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-eagle3.yaml"))
    table = profile_cost(pipeline.target, pipeline.drafter, batch_tokens=[1], requests=1, context=8, reps=1,
                         max_batch=1, progress=False)
    assert table.draft_batches == [1] and len(table.catch_up_seconds) == 1


def test_profile_times_each_proposal_after_a_steps_commit():
    """Serving proposes right after committing what the last step accepted, and the profile times
    the same: an EAGLE-3 proposal from an unchanged state skips its catch-up pass (k = 1 looked
    free). Requests take turns, so every one's context grows by about the same. Requests of their
    own then time proposals after a pile of CATCH_UP_POSITIONS (steps without drafting) against
    one step's commit."""
    import copy

    from trtspec.bench.profile import ACCEPTED_PER_STEP, CATCH_UP_POSITIONS, profile_cost
    from trtspec.config import load_build_config
    from trtspec.pipeline import load_pipeline

    pipeline = load_pipeline(load_build_config(REPO / "build_configs" / "tiny-eagle3.yaml"))
    calls = []

    class Recording(type(pipeline.drafter)):
        def commit(self, slot, num_accepted, hidden):
            calls.append(("commit", slot, num_accepted, hidden.shape[0]))
            super().commit(slot, num_accepted, hidden)

        def propose(self, rows, k):
            calls.append(("propose", tuple(r.slot for r in rows), k))
            return super().propose(rows, k)

    drafter = copy.copy(pipeline.drafter)
    drafter.__class__ = Recording
    table = profile_cost(pipeline.target, drafter, batch_tokens=[1, 4], requests=4, context=16, reps=2,
                         max_batch=4, progress=False)
    proposals = [i for i, c in enumerate(calls) if c[0] == "propose"]
    # requests 0-3 time the steady state, 4-7 the catch-up after a pile of CATCH_UP_POSITIONS
    steady = [i for i in proposals if max(calls[i][1]) < 4]
    catch = [i for i in proposals if min(calls[i][1]) >= 4]
    assert len(steady) == 1 + 2 * len(table.draft_batches) * len(table.draft_lens)  # warm-up + timed
    assert len(catch) == 1 + 2 * len(table.draft_batches) * 2 and proposals == steady + catch
    previous = proposals[0]
    assert calls[:previous] == []  # the warm-up absorbs the prompts
    for i in proposals[1:]:
        commits = calls[previous + 1 : i]
        if i == catch[0]:  # the catch-up requests' warm-up absorbs their prompts
            assert commits == []
        else:
            assert [c[1] for c in commits] == list(calls[i][1])  # exactly the proposing requests
            piles = {ACCEPTED_PER_STEP + 1} | ({CATCH_UP_POSITIONS} if i in catch else set())
            assert {c[3] for c in commits} <= piles and all(c[2] == c[3] - 1 for c in commits)
        previous = i
    for i in catch:
        assert calls[i][2] == min(table.draft_lens)
    assert table.draft_catch_up == ACCEPTED_PER_STEP + 1 and len(table.catch_up_seconds) == 3
    assert any(s > 0 for s in table.catch_up_seconds)  # 30 more positions per request cost time
    turns = [c[1] for c in calls if c[0] == "commit" and c[1] < 4]
    counts = [turns.count(s) for s in range(4)]
    assert max(counts) - min(counts) <= max(table.draft_batches)
    assert table.verify_rows == [1, 2, 4] and table.verify_tokens_per_row == [1, 2, 3, 4, 6, 8]
    # the grid again at a quarter of the context, and the loop's own time at each R
    assert (table.verify_context, table.short_context) == (16, 4)
    assert [len(r) for r in table.short_steps_per_s] == [len(r) for r in table.verify_steps_per_s]
    assert table.loop_rows == [1, 2, 4] and all(s > 0 for s in table.loop_seconds)
    # every curve is monotone: more requests, tokens or drafts never cost less (`monotone_envelope`)
    per_s = (table.verify_steps_per_s, table.short_steps_per_s, [table.steps_per_s])
    seconds = [table.draft_seconds] + [[[1 / sps for sps in row] for row in grid] for grid in per_s]
    for grid in seconds:
        assert all(row == sorted(row) for row in grid)
        assert all(list(column) == sorted(column) for column in zip(*grid, strict=True))


def test_monotone_envelope_removes_slow_outliers_and_keeps_what_was_measured():
    """Interference only adds time: on a grid whose work grows along both axes, the envelope of a
    measurement with slow outliers is monotone, lies between the true grid and the measurement,
    is exact at every cell measured cleanly, and a slow cell costs at most its clean neighbours."""
    import itertools
    import random

    from trtspec.bench.profile import monotone_envelope

    rng = random.Random(5)
    for _ in range(50):
        rows, cols = rng.randint(1, 6), rng.randint(1, 10)
        by_row = list(itertools.accumulate(rng.uniform(0, 2e-3) for _ in range(rows)))
        by_col = list(itertools.accumulate(rng.uniform(0, 5e-4) for _ in range(cols)))
        true = [[1e-3 + a + b for b in by_col] for a in by_row]  # [rows, cols] seconds, increasing
        assert monotone_envelope(true) == true
        slow = {(rng.randrange(rows), rng.randrange(cols)) for _ in range(rng.randint(1, 3))}
        measured = [[t * (rng.uniform(1.5, 3) if (i, j) in slow else 1) for j, t in enumerate(row)]
                    for i, row in enumerate(true)]
        env = monotone_envelope(measured)
        for i, j in itertools.product(range(rows), range(cols)):
            assert true[i][j] <= env[i][j] <= measured[i][j]
            assert j + 1 == cols or env[i][j] <= env[i][j + 1]
            assert i + 1 == rows or env[i][j] <= env[i + 1][j]
            if (i, j) not in slow:
                assert env[i][j] == true[i][j]
            for beyond in ((i, j + 1), (i + 1, j)):
                if beyond not in slow and beyond[0] < rows and beyond[1] < cols:
                    assert env[i][j] <= true[beyond[0]][beyond[1]]


def test_paired_medians_cancel_the_machines_drift_between_repetitions():
    """Each repetition times every cell within a second or two; between repetitions the machine's
    speed drifts (here by up to 2x). Timed against the plain step of the same repetition, every
    cell's ratio to the plain step keeps only its own jitter (here at most 3 % each way), whatever
    the drift; medians taken cell by cell mix repetitions and do not (the explicit case below)."""
    import random

    from trtspec.bench.profile import _paired_medians

    rng = random.Random(11)
    for _ in range(50):
        reps, cols = rng.choice([3, 5, 15]), rng.randint(2, 8)
        true = sorted(rng.uniform(1e-3, 5e-3) for _ in range(cols))  # one row, true[0]: the plain step
        drift = [rng.uniform(1.0, 2.0) for _ in range(reps)]
        cells = {(0, c): [true[c] * d * rng.uniform(0.97, 1.03) for d in drift] for c in range(cols)}
        got = _paired_medians(cells, [0], list(range(cols)), {0: cells[(0, 0)]})[0]
        bound = (1.03 / 0.97) ** 2
        for c in range(1, cols):
            assert 1 / bound <= (got[c] / got[0]) / (true[c] / true[0]) <= bound
    # three repetitions, the machine 10 % and 20 % slower in the second and third, the second
    # timing of cell 1 with 10 % jitter: the ratios say 1.0, cell-by-cell medians 1.0 / 1.1
    cells = {(0, 0): [1.0, 1.1, 1.2], (0, 1): [1.0, 0.99, 1.2]}
    assert _paired_medians(cells, [0], [0, 1], {0: cells[(0, 0)]}) == [[1.1, 1.1]]


def test_bench_counts_bfloat16_partings_at_near_ties_apart_from_mismatches(monkeypatch):
    """In bfloat16 DFlash parts from the target alone on some math prompts (its 16-token verify
    rounds differently): the bench counts those as near-ties after auditing them, not as greedy
    mismatches, and says so in its table. The bench runs the two math prompts that part (4 and 7
    of the shipped eight; the other six decode alike and only took time)."""
    from trtspec.bench import run
    from trtspec.bench.run import markdown_table, run_bench
    from trtspec.config import load_build_config
    from trtspec.prompts import load_prompts

    monkeypatch.setattr(run, "load_prompts", lambda task: [load_prompts(task)[i] for i in (4, 7)])

    config = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    bf16 = {"dtype": "bfloat16"}
    config = config.model_copy(update={"target": config.target.model_copy(update=bf16),
                                       "drafter": config.drafter.model_copy(update=bf16)})
    results = run_bench({"dflash": config}, ["math"], prompts_per_task=2, max_tokens=96, hf_reference=False)
    row = results["tasks"]["math"]["dflash"]
    # prompts 4 and 7 part on this CPU's bfloat16 kernels (at tokens 32 and 43 when written)
    assert row["greedy_mismatches"] == 0 and row["greedy_near_ties"] >= 1
    assert f"| 0 (+{row['greedy_near_ties']} at near-ties) |" in markdown_table(results)


def test_sampled_bench_checks_coupled_texts_and_seeds_every_prompt(tmp_path, monkeypatch):
    """--temperature samples every method with prompt i seeded SEED + i; --coupling both runs each
    drafter twice: NAME (rejection: its texts cannot be compared one by one) and NAME+gumbel, whose
    every text must be the target alone's Gumbel-max sample (none+gumbel), trees and concurrent
    requests included; the cost table the concurrent runs measure is measured once per drafter."""
    # one repetition of each cost-table timing, not 15: the table's figures are not checked here,
    # only that the run measures one per drafter
    monkeypatch.setattr("trtspec.bench.concurrency.PROFILE_REPS", 1)
    configs = [str(REPO / "build_configs" / f"{n}.yaml") for n in ("tiny-dflash", "tiny-draft-model")]
    # one prompt per task: prompts 0 and 1 (seeds 11 and 12), each task's rows, and 2 requests in flight
    result = CliRunner().invoke(main, ["bench", *configs, "--tasks", "code,chat", "--prompts", "1",
                                       "--max-tokens", "24", "--no-hf", "--temperature", "0.8", "--top-k",
                                       "50", "--seed", "11", "--coupling", "both", "--tree", "8,2",
                                       "--concurrency", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["sampling"] == {"temperature": 0.8, "top_p": 1.0, "top_k": 50, "seed": 11}
    coupled = {"none+gumbel", "dflash+gumbel", "draft_model+gumbel", "dflash+gumbel+tree",
               "draft_model+gumbel+tree"}
    for rows in results["tasks"].values():
        assert set(rows) == coupled | {"none", "dflash", "draft_model", "dflash+tree", "draft_model+tree"}
        for name, row in rows.items():
            assert "greedy_mismatches" not in row, name
            if name in coupled:
                assert row["sampled_mismatches"] == 0 and row["sampled_near_ties"] == 0, name
                assert row["tokens"] == rows["none+gumbel"]["tokens"], name
            else:
                assert "sampled_mismatches" not in row, name
        assert rows["draft_model+gumbel"]["tau"] > 1.0
    conc = results["concurrency"]["methods"]
    assert {"none+gumbel", "dflash+gumbel+adaptive", "draft_model+adaptive"} <= set(conc)
    tables = results["concurrency"]["cost_tables"]  # one measurement per drafter, shared by its couplings
    assert tables["dflash+gumbel"] == tables["dflash"] != tables["draft_model"]
    assert tables["draft_model+gumbel"] == tables["draft_model"]
    for method, by_r in conc.items():
        row = by_r["2"]
        assert ("sampled_mismatches" in row) == ("gumbel" in method), method
        assert row.get("sampled_mismatches", 0) == 0, method
    table = (tmp_path / "results.md").read_text()
    assert "texts ≠ the target alone's (coupled)" in table and "| chat | dflash | " in table


def test_sampled_bench_tells_a_coupled_text_that_is_not_the_targets(tmp_path):
    """The coupled check can fail: a drafter whose target is another model (the draft model as
    target) samples other texts under the same seeds, and every one is counted."""
    from trtspec.bench.run import run_bench
    from trtspec.bench.sampled import with_couplings
    from trtspec.config import load_build_config
    from trtspec.spec.sampling import SamplingParams

    reference = load_build_config(REPO / "build_configs" / "tiny-dflash.yaml")
    other = load_build_config(REPO / "build_configs" / "tiny-draft-model.yaml")
    wrong = other.model_copy(update={"target": other.target.model_copy(
        update={"path": str(other.drafter.resolved_path)})})
    sampling = SamplingParams(temperature=1.0, seed=3)
    configs = with_couplings({"dflash": reference, "draft_model": wrong}, sampling, "gumbel")
    results = run_bench(configs, ["math"], prompts_per_task=2, max_tokens=24, hf_reference=False,
                        sampling=sampling)
    rows = results["tasks"]["math"]
    assert rows["dflash+gumbel"]["sampled_mismatches"] == 0
    assert rows["draft_model+gumbel"]["sampled_mismatches"] == 2


def test_remote_requests_carry_each_prompts_seed():
    from trtspec.bench.remote import _params
    from trtspec.spec.sampling import SamplingParams

    greedy = _params(24, SamplingParams(), 3)
    assert (greedy.temperature, greedy.seed, greedy.max_tokens, greedy.stream) == (None, None, 24, True)
    sampled = _params(24, SamplingParams(temperature=0.7, top_p=0.9, top_k=5, seed=40), 3)
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.seed) == (0.7, 0.9, 5, 43)


def test_remote_warms_up_with_prompts_it_does_not_measure():
    from trtspec.bench.remote import WARMUP_PROMPT, warmup_prompts
    from trtspec.prompts import load_prompts

    tasks = ["code", "math", "chat"]
    measured = {p for t in tasks for p in load_prompts(t)[:8]}
    spare = warmup_prompts(tasks, 8)
    assert spare and not measured & set(spare)  # code.jsonl repeats a prompt past the first 8: left out
    assert warmup_prompts(["chat"], 100) == [WARMUP_PROMPT]


def test_remote_tau_is_pooled_over_every_request_that_reports_draft_figures():
    """Σ tokens / Σ target forwards, as the in-process bench pools τ: a request that drafted
    nothing counts (τ 1), one whose server reports no draft figures (a foreign server) does not."""
    from trtspec.bench.remote import level_row, request_record
    from trtspec.triton.client import Completion

    def done(tokens: int, accepted: int | None, drafted: int | None) -> dict:
        return request_record(0, Completion(token_ids=list(range(tokens)), accepted_tokens=accepted,
                                            draft_tokens=drafted, first_response_s=0.1, total_s=1.0))

    speculative, plain, foreign = done(30, 20, 32), done(10, 0, 0), done(50, None, None)
    assert level_row([speculative, plain, foreign], 1.0)["tau"] == (30 + 10) / (10 + 10)
    assert level_row([plain], 1.0)["tau"] == 1.0
    assert level_row([foreign], 1.0)["tau"] is None
    assert level_row([done(1, 0, 0)], 1.0)["tau"] == 1.0  # one token of one target forward


def test_remote_level_figures_recompute_from_the_request_records():
    """AIPerf's definitions on synthetic records: TTFT over the requests that got a token, ITL over
    those of at least 2 tokens, percentiles by numpy's linear interpolation, tokens/s per user
    1 / mean ITL; a request with no token has no TTFT (it used to stop the bench with a TypeError
    over OpenAI, and to count its last response's time as a TTFT over Triton); a failed request
    is counted apart and left out of every figure."""
    from trtspec.bench.remote import level_row, remote_table, request_record
    from trtspec.triton.client import Completion

    def done(tokens: int, ttft: float | None, total: float, later: tuple[float, ...] = ()) -> Completion:
        """`tokens` in responses at `ttft` and `later` (seconds after sending)."""
        c = Completion(completion_tokens=tokens, total_s=total)
        for at in ([] if ttft is None else [ttft, *later]):
            c.arrived(at)
        return c

    records = [request_record(0, done(11, 0.010, 0.110, (0.030, 0.110))),  # ITL 10 ms; gaps 20, 80 ms
               request_record(1, done(21, 0.020, 0.420, (0.420,))),  # ITL 20 ms; one gap, 400 ms
               request_record(2, done(5, 0.040, 0.160, (0.100, 0.160))),  # ITL 30 ms; gaps 60, 60 ms
               request_record(3, done(1, 0.030, 0.030)),  # one token: a TTFT, no ITL, no gap
               request_record(4, done(0, None, 0.050)),  # no token: neither
               request_record(5, error="prompt: too long for the context")]
    row = level_row(records, wall=0.5)
    assert row["ttft_ms"] == pytest.approx(1e3 * (0.010 + 0.020 + 0.040 + 0.030) / 4)
    assert row["ttft_ms_percentiles"] == {"p50": 25.0, "p90": 37.0, "p99": 39.7}  # of 10, 20, 30, 40
    assert row["itl_ms"] == pytest.approx(20.0)
    assert row["itl_ms_percentiles"] == {"p50": 20.0, "p90": 28.0, "p99": 29.8}
    assert row["per_user_tokens_per_s"] == pytest.approx(50.0)
    assert row["latency_ms"] == pytest.approx(1e3 * (0.110 + 0.420 + 0.160 + 0.030 + 0.050) / 5)
    assert row["tokens"] == 11 + 21 + 5 + 1 and row["total_tokens_per_s"] == pytest.approx(38 / 0.5)
    assert (row["completed"], row["errors"], row["first_error"]) == (5, 1, "prompt: too long for the context")
    # how the tokens came: 38 tokens in 3 + 2 + 3 + 1 responses; the longest gaps 80, 400, 60 ms
    assert row["tokens_per_response"] == pytest.approx(38 / 9, abs=0.005)
    assert row["longest_gap_ms"] == pytest.approx(180.0)
    assert row["longest_gap_ms_percentiles"] == {"p50": 80.0, "p90": 336.0, "p99": 393.6}
    table = remote_table({"levels": {"4": row}})
    assert "| 4 | 25.0 | 39.7 | 20.00 | 29.80 | 50.0 | 76.0 | – | 4.22 | 393.6 | 1 |" in table
    assert "R = 4: 1 failed, the first: prompt: too long for the context" in table
    nothing = level_row([request_record(0, done(0, None, 0.05))], wall=0.05)
    assert (nothing["ttft_ms"], nothing["itl_ms"], nothing["per_user_tokens_per_s"]) == (None, None, 0.0)
    two = level_row([request_record(0, done(2, 0.010, 0.030, (0.030,)))], wall=0.03)  # the fewest with an ITL
    assert two["itl_ms"] == pytest.approx(20.0) and two["per_user_tokens_per_s"] == pytest.approx(50.0)


def test_a_streams_totals_only_response_is_no_first_token():
    """Triton streams: TTFT is the first response that carries a token (ids or text), not one that
    carries only the totals (the whole answer of a request that generated nothing)."""
    import time

    from trtspec.triton.client import Completion

    c, t0 = Completion(), time.perf_counter()
    c.add({"text_output": "", "output_ids": [], "accepted_tokens": 0}, None, t0)
    assert c.first_response_s is None and c.num_tokens == 0
    c.add({"text_output": "", "output_ids": [7]}, None, t0)  # text held back, a token all the same
    assert c.first_response_s is not None and c.token_responses == 1


def test_remote_bench_that_reaches_no_server_fails_with_its_error():
    """Every request failing (nothing listening) is one error naming the cause, not an empty table."""
    from trtspec.bench.remote import run_remote
    from trtspec.triton.client import ClientError

    from .conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ClientError, match=r"every request at concurrency 2 failed: cannot reach"):
        run_remote(url, "trtspec", ["math"], 2, 4, [2])


def test_bench_refuses_more_clients_than_prompts(tmp_path):
    """R above the prompts never has R requests in flight: in process, the steady state ("every
    slot busy") ended after the first step, so R = 4 over 2 prompts reported the prefill step's 2
    tokens over its time as total tokens/s (55 where the whole run gave 73)."""
    config = str(REPO / "build_configs" / "tiny-dflash.yaml")
    for where in ([config, "--no-hf"], ["--url", "grpc://127.0.0.1:1"]):
        result = CliRunner().invoke(main, ["bench", *where, "--tasks", "math", "--prompts", "2",
                                           "--max-tokens", "4", "--concurrency", "1,4",
                                           "--out", str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        assert "--concurrency" in result.output and "4 exceeds the 2 prompts" in result.output
    assert not (tmp_path / "out").exists()


def test_adaptive_is_compared_with_its_own_drafters_fixed_settings_only():
    """With --coupling both, `dflash+gumbel` and `dflash+gumbel+adaptive` are the other coupling's
    methods, not fixed settings of `dflash`: adaptive is set against none, whole blocks, the
    scheduler and thresholds of its own coupling."""
    from trtspec.bench.report import adaptive_summary

    def row(tps):
        return {"1": {"total_tokens_per_s": tps, "run_tokens_per_s": tps}}

    conc = {"methods": {"none": row(100.0), "dflash": row(120.0), "dflash+adaptive": row(150.0),
                        "dflash+gumbel": row(300.0), "dflash+gumbel+adaptive": row(200.0),
                        "dflash+threshold0.5": row(125.0)}}
    lines = adaptive_summary(conc)
    assert lines[0].startswith("- dflash: R=1: full 1.20, adaptive 1.50× none, 1.20× max(none, best fixed)")
    assert lines[1].startswith("- dflash+gumbel: R=1: full 3.00, adaptive 2.00× none, 0.67× max(none, best "
                               "fixed)")


def test_a_whole_run_ratio_missing_on_either_side_reads_as_a_dash():
    """Results written before whole-run tokens/s were kept have no `run_tokens_per_s`: adaptive's
    whole-run ratio is then "–", whether its own row or the target alone's lacks it; where both
    have it, 150 / 100 = 1.50."""
    from trtspec.bench.report import adaptive_summary

    def conc(adaptive_run, none_run) -> dict:
        def row(tps, run):
            return {"1": {"total_tokens_per_s": tps} | ({} if run is None else {"run_tokens_per_s": run})}

        return {"methods": {"none": row(100.0, none_run), "dflash": row(120.0, 120.0),
                            "dflash+adaptive": row(150.0, adaptive_run)}}

    assert adaptive_summary(conc(150.0, 100.0))[0].endswith("(whole run 1.50× none)")
    for adaptive_run, none_run in ((None, 100.0), (150.0, None)):
        assert adaptive_summary(conc(adaptive_run, none_run))[0].endswith("(whole run –× none)")


def test_headline_sets_dflash_against_assisted_generation():
    """With transformers' rows the headline says how DFlash's speedup over the target alone (10 s /
    4 s = 2.5×) compares with assisted generation's over transformers generate (12 s / 8 s = 1.5×):
    2.5 / 1.5 = 1.67."""
    from trtspec.bench.report import headline

    def row(seconds: float, tau: float) -> dict:
        return {"tokens": 100, "seconds": seconds, "tau": tau}

    results = {"tasks": {"code": {"none": row(10.0, 1.0), "dflash": row(4.0, 3.0),
                                  "hf_generate": row(12.0, 1.0), "hf_assisted": row(8.0, 2.0)}}}
    lines = headline(results)
    assert "- transformers assisted generation (draft_model as assistant): 1.50× over transformers " \
        "generate" in lines
    assert "- DFlash speedup / assisted-generation speedup: 1.67" in lines
    assert not any("lookup pool" in line for line in lines)  # no `-pool` method, no note on one


def test_headline_lists_known_drafters_first_each_followed_by_its_variants():
    """The drafter rows (not none and transformers' own), known methods in DFlash, DSpark, EAGLE-3,
    draft-model order, each method's variants (`+tree`, `-k16`) right after it, any other method
    last, whatever order the run wrote them in; the plots' bars and curves follow the same order."""
    from trtspec.bench.report import headline

    names = ["none", "custom", "eagle3-k16", "draft_model", "dflash+tree", "hf_generate", "eagle3",
             "dspark", "dflash", "hf_assisted"]
    row = {"tokens": 100, "seconds": 5.0, "tau": 2.0}
    lines = headline({"tasks": {"code": {name: dict(row) for name in names}}})
    listed = [line[2:].split(":")[0] for line in lines if line.startswith("- ") and ": τ " in line]
    assert listed == ["dflash", "dflash+tree", "dspark", "eagle3", "eagle3-k16", "draft_model", "custom"]


def test_plots_of_a_run_with_eagle3_chains_and_no_dflash_blocks(tmp_path):
    """A run whose drafters include EAGLE-3 but not DFlash has chain times and no block times: its
    draft-cost figure is drawn from the chains alone (no interactivity figure without concurrency)."""
    from trtspec.bench.report import write_plots

    rows = {"none": {"tau": 1.0}, "eagle3": {"tau": 2.5, "acceptance_by_position": [0.8, None]}}
    results = {"tasks": {"code": rows}, "eagle3_chain_time_s": {"eagle3": {"3": 0.004, "15": 0.02}}}
    plots = write_plots(results, tmp_path / "figs")
    assert [p.name for p in plots] == ["tau.png", "acceptance_by_position.png", "dflash_block_time.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in plots)


def test_prompt_seeds_wrap_as_uint64():
    """bench --seed takes any UINT64 (as generate and Triton's random_seed): prompt i samples with
    SEED + i modulo 2^64, never past what a server accepts."""
    from trtspec.bench.sampled import request_params
    from trtspec.spec.sampling import SamplingParams

    last = SamplingParams(temperature=1.0, seed=2**64 - 1)
    assert [request_params(last, i, "rejection").seed for i in range(3)] == [2**64 - 1, 0, 1]
    assert request_params(SamplingParams(), 5, "rejection").seed is None  # greedy stays greedy


def test_acceptance_by_position_pools_the_cycles_of_every_request():
    """The per-task curve averaged each request's own curve, and a request that never offered a
    position counted 0 there: on `bench tiny-dflash --tasks math,chat --prompts 4 --max-tokens 12`
    positions 11–15 (never offered within 12 tokens) read 0.0 as 'P(accepted | offered)', and
    position 1 on math 0.525 against 0.462 over its verify steps. Like τ (Σ tokens / Σ forwards)
    it now pools the cycles of all requests; a position no cycle offered is null."""
    from trtspec.bench.run import MethodStats
    from trtspec.spec.metrics import GenerationResult

    long, short = GenerationResult(prompt_len=4, num_draft_tokens=3), GenerationResult(4, 3)
    for _ in range(9):  # 9 cycles of 3 drafts, all accepted
        long.record_cycle(3, 3)
    short.record_cycle(1, 0)  # one cycle of 1 draft (its budget), rejected
    stats = MethodStats()
    for prompt, result in enumerate((long, short)):
        stats.record(prompt, result)
    assert stats.summary(None)["acceptance_by_position"] == [0.9, 1.0, 1.0]  # was [0.5, 0.5, 0.5]
    unreached = MethodStats()
    unreached.record(0, short)
    assert unreached.summary(None)["acceptance_by_position"] == [0.0, None, None]  # was [0, 0, 0]


def _prompt_times(rng, n: int, ratio: float, noise: float = 0.15):
    """Seconds per prompt [n] of the target alone (prompts of very different lengths) and of a
    method `ratio` times faster, each prompt's own speedup varying by `noise` (log-normal)."""
    base = rng.lognormal(0.0, 0.6, n)
    return base, base / (ratio * rng.lognormal(0.0, noise, n))


def test_speedup_interval_covers_the_true_ratio_as_often_as_it_says():
    """Samples of 12 prompts of each of two tasks (one speeds up 1.2×, the other 3×) from one
    population: the true pooled speedup (Σ none / Σ method over the whole population, a million
    prompts of each task) lies inside 95 % intervals about 95 % of the time. Resampling the two
    methods' prompts independently (unpaired), or the tasks' prompts together (their mix then
    varies, which the run's does not), would make the intervals too wide; narrower quantiles, too
    narrow."""
    import numpy as np

    from trtspec.bench.interval import ratio_interval

    rng = np.random.default_rng(11)

    def sample(n: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        (b1, o1), (b2, o2) = _prompt_times(rng, n, 1.2), _prompt_times(rng, n, 3.0)
        return np.concatenate([b1, b2]), np.concatenate([o1, o2]), ["code"] * n + ["math"] * n

    base, other, _ = sample(1_000_000)
    truth = base.sum() / other.sum()
    covered = []
    for trial in range(300):
        low, high = ratio_interval(*sample(12), draws=2000, seed=trial)
        covered.append(low <= truth <= high)
    assert 0.88 <= np.mean(covered) <= 0.985, np.mean(covered)


def test_speedup_interval_of_prompts_that_all_speed_up_alike_is_that_speedup():
    from trtspec.bench.interval import ratio_interval

    base = [0.9, 2.5, 1.2, 0.4, 3.3, 1.1, 0.7, 2.0]
    low, high = ratio_interval(base, [t / 1.5 for t in base])
    assert low == pytest.approx(1.5) and high == pytest.approx(1.5)
    with pytest.raises(ValueError, match=r"paired timings"):
        ratio_interval(base, base[:-1])
    with pytest.raises(ValueError, match=r"one task per prompt"):
        ratio_interval(base, base, ["code"] * 7)


def test_speedup_interval_draws_every_prompt_of_each_task():
    """One prompt of eight sped up 10×, the first of its task's four: a resample holds it about
    two times in three, so the interval reaches above 1 at its top and 1 at its bottom."""
    from trtspec.bench.interval import ratio_interval

    base = [1.0] * 4 + [10.0, 1.0, 1.0, 1.0]
    low, high = ratio_interval(base, [1.0] * 8, ["code"] * 4 + ["math"] * 4)
    assert low == pytest.approx(1.0) and high > 1.5


def test_speedup_interval_leaves_as_many_draws_out_on_each_side():
    """The level's interval cuts (1 − level) / 2 of the draws at each end: the same draws as ratios
    the other way up give the reciprocal interval (up to adjacent draws)."""
    import numpy as np

    from trtspec.bench.interval import ratio_interval

    base, other = _prompt_times(np.random.default_rng(3), 24, 2.0, noise=0.8)
    low, high = ratio_interval(base, other)
    inverse_low, inverse_high = ratio_interval(other, base)
    assert high > 1.2 * low
    assert inverse_low == pytest.approx(1 / high, rel=1e-6)
    assert inverse_high == pytest.approx(1 / low, rel=1e-6)


def test_pooled_speedups_carry_their_interval_when_the_run_kept_each_prompts_seconds():
    """The report's pooled line puts each speedup inside its interval; results written before
    per-prompt seconds were kept, or with too few prompts, report the speedup alone."""
    import numpy as np

    from trtspec.bench.report import headline

    rng = np.random.default_rng(5)

    def row(seconds, tau: float) -> dict:
        return {"tokens": 100 * len(seconds), "seconds": float(sum(seconds)), "tau": tau,
                "prompt_seconds": [float(s) for s in seconds]}

    def results(*prompts: int) -> dict:  # prompts of each task
        tasks = {}
        for task, n in zip(("code", "math"), prompts, strict=True):
            base, dflash = _prompt_times(rng, n, 1.6)
            tasks[task] = {"none": row(base, 1.0), "dflash": row(dflash, 3.0)}
        return {"tasks": tasks}

    line = next(line for line in headline(results(6, 6)) if line.startswith("- dflash"))
    figures = re.search(r"none ([\d.]+)× \[([\d.]+)–([\d.]+)×\]", line)
    speedup, low, high = (float(x) for x in figures.groups())
    assert low < speedup < high and high - low < 1.0, line
    # the least that carries one: MIN_PROMPTS = 8 prompts in all, the smaller task of 2
    assert "[" in next(line for line in headline(results(6, 2)) if line.startswith("- dflash"))
    for few in (results(3, 3), results(9, 1)):  # 6 prompts in all; a task of one prompt
        assert "[" not in next(line for line in headline(few) if line.startswith("- dflash"))
    old = results(6, 6)
    for rows in old["tasks"].values():
        for r in rows.values():
            del r["prompt_seconds"]
    assert next(line for line in headline(old) if line.startswith("- dflash")).endswith("×")
