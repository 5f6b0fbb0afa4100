"""gpu_check's parity rows say whether speculation happened: the speculative run's drafted and
accepted counts and τ are in each row, and a row whose run never drafted, or never had a draft
accepted, fails however identical its output (it then came from the target alone)."""

from __future__ import annotations

import json

import torch

from trtspec.config import ScheduleConfig
from trtspec.gpu_check import Run, _lossless_rows, check_coupling, speculation
from trtspec.spec.metrics import GenerationResult
from trtspec.spec.schedule import SPSTable

# verifying more tokens costs nothing: the adaptive schedule drafts whole blocks
FREE_VERIFY = SPSTable(batch_tokens=[1, 256], steps_per_s=[100.0, 100.0], machine="given here")
# one more token per forward costs 100×: no draft length pays, at any acceptance
DEAR_VERIFY = SPSTable(batch_tokens=[1, 2], steps_per_s=[100.0, 1.0], machine="given here")


def _small_run(tmp_path, table: SPSTable) -> Run:
    run = Run(torch.device("cpu"), True, tmp_path)
    run._cost_table = table  # what share_cost_table hands the parity pipelines, instead of measuring one
    return run


def test_parity_rows_carry_the_speculative_runs_counts(tmp_path):
    run = _small_run(tmp_path, FREE_VERIFY)
    _lossless_rows(run, "float32")
    check_coupling(run)
    run.write()
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    rows = [r for r in report["rows"] if "DFlash" in r["check"]]
    assert [r["check"] for r in rows] == ["DFlash greedy == target alone (cpu fp32)",
                                          "DFlash greedy at R = 4 == target alone (cpu fp32)",
                                          "DFlash Gumbel-coupled sampling at R = 4 == target alone (cpu)"]
    for row in rows:
        assert row["ok"], row
        assert row["accepted"] > 0 and row["drafted"] >= row["accepted"] and row["tau"] > 1.0, row
        assert f"{row['accepted']}/{row['drafted']} drafts accepted, τ {row['tau']:.2f}" in row["detail"]
    assert "drafts accepted, τ" in (tmp_path / "gpu_check.md").read_text()


def test_a_parity_row_whose_run_never_drafted_fails(tmp_path):
    """The adaptive schedule with a cost model under which no draft pays, and no probes: the output
    is the target's own, identical and proving nothing about the speculative path."""
    run = _small_run(tmp_path, DEAR_VERIFY)
    _lossless_rows(run, "float32", ScheduleConfig(mode="adaptive", probe_every=0))
    assert len(run.rows) == 2
    for row in run.rows:
        assert not row["ok"] and row["drafted"] == 0 and row["accepted"] == 0, row
        assert row["detail"].startswith("2/2 prompts identical; 0/0 drafts accepted")
        assert "FAILS: nothing drafted, the speculative path never ran" in row["detail"]


def test_speculation_names_a_run_without_accepted_drafts():
    result = GenerationResult(prompt_len=3, num_draft_tokens=15, token_ids=[5, 6, 7], num_target_calls=3)
    result.record_cycle(num_drafted=15, num_accepted=0)
    result.record_cycle(num_drafted=15, num_accepted=0)
    counts, text = speculation([result])
    assert counts == {"drafted": 30, "accepted": 0, "tau": 1.0}
    assert text == "0/30 drafts accepted, τ 1.00 (FAILS: no draft accepted, every token came from the target)"
