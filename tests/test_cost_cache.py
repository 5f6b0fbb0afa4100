"""The measured cost model is cached by what it depends on: the models' weights and how they run,
not the folders they sit in nor the schedule that reads the table."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from trtspec.config import ASSETS_DIR, load_build_config
from trtspec.pipeline import cost_table_path, load_pipeline
from trtspec.spec.schedule import SPSTable

from .conftest import REPO

CONFIG = """\
target: {{path: {target}}}
drafter: {{method: dflash, path: {drafter}, num_draft_tokens: {k}{extra}}}
limits: {{max_concurrency: {slots}}}
"""
BUILTIN = ("builtin:tiny-target", "builtin:tiny-dflash-b16")


def _config(tmp_path, name: str, models=BUILTIN, k: int = 4, slots: int = 1, extra: str = ""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(CONFIG.format(target=models[0], drafter=models[1], k=k, slots=slots, extra=extra))
    return load_build_config(path)


def test_a_copied_build_and_another_schedule_share_one_measured_table(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CACHE_DIR", str(tmp_path / "cache"))
    # what `trtspec build` does: the same checkpoints copied into another folder
    for name in ("tiny-target", "tiny-dflash-b16"):
        shutil.copytree(ASSETS_DIR / name, tmp_path / "copy" / name)
    copied = tuple(str(tmp_path / "copy" / name) for name in ("tiny-target", "tiny-dflash-b16"))
    first = cost_table_path(_config(tmp_path, "a"))
    same = [_config(tmp_path, "b", copied),
            _config(tmp_path, "c", extra=", schedule: {mode: adaptive, min_gain: 0.3, probe_every: 4}"),
            _config(tmp_path, "d", extra=", tree: {nodes: 8, topk: 2}")]
    assert [cost_table_path(c) for c in same] == [first] * 3
    # what the table measures: chains up to k drafts, batches up to max_concurrency
    assert cost_table_path(_config(tmp_path, "e", k=8)) != first
    assert cost_table_path(_config(tmp_path, "f", slots=2)) != first
    # a pipeline of the copied build loads the cached table instead of measuring (~30 s) again
    table = SPSTable(batch_tokens=[1, 8], steps_per_s=[90.0, 70.0], machine="cached", draft_batches=[1],
                     draft_lens=[1, 4], draft_seconds=[[0.002, 0.003]], drafter="dflash")
    first.parent.mkdir(parents=True)
    first.write_text(table.model_dump_json())
    assert load_pipeline(same[0]).cost_table == table


def test_the_test_sessions_cache_folder_is_removed_when_it_ends(tmp_path):
    """conftest gives each test session a fresh cache folder (exported graphs, cost tables): it is
    gone once the session's process ends, not left in the temp folder run after run."""
    env = {k: v for k, v in os.environ.items() if k != "TRTSPEC_CACHE_DIR"} | {"TMPDIR": str(tmp_path)}
    probe = ("import os, pathlib, tests.conftest; d = pathlib.Path(os.environ['TRTSPEC_CACHE_DIR']); "
             "(d / 'cost').mkdir(); (d / 'cost' / 'x.json').write_text('{}'); print(d)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    folder = Path(out.splitlines()[-1])
    assert folder.parent == tmp_path and folder.name.startswith("trtspec-test-cache-")
    assert not folder.exists()
