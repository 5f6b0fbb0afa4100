"""`trtspec bench` on a tiny run: well-formed results, real PNGs, speedups from this run's timings."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trtspec.cli import main

from .conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_tiny_bench(tmp_path):
    configs = [str(REPO / "build_configs" / f"{n}.yaml") for n in ("tiny-dflash", "tiny-draft-model")]
    result = CliRunner().invoke(main, ["bench", *configs, "--tasks", "code,math", "--prompts", "1",
                                       "--max-tokens", "24", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
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
        assert len(rows["dflash"]["acceptance_by_position"]) == 15
        assert rows["none"]["tau"] == 1.0 and rows["dflash"]["tau"] > 1.0
    for png in ("tau.png", "acceptance_by_position.png", "dflash_block_time.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC
    report = (tmp_path / "BENCHMARKS.md").read_text()
    assert "| code | dflash |" in report and "B=16 / B=4" in report
