"""trtspec.prompts: the shipped prompt sets are what `python -m trtspec.prompts` writes, byte for
byte (every machine benchmarks and distils on the same prompts), and an unknown task is named."""

from __future__ import annotations

import pytest

from trtspec.prompts import PROMPTS_DIR, TASKS, load_prompts, write_prompt_sets


def test_the_shipped_prompt_sets_are_regenerated_byte_for_byte(tmp_path):
    write_prompt_sets(tmp_path / "a" / "prompts")  # folders not there yet
    write_prompt_sets(tmp_path / "a" / "prompts")  # then there: written over
    names = [f"{task}.jsonl" for task in TASKS] + ["train-drafter.jsonl"]
    assert sorted(p.name for p in (tmp_path / "a" / "prompts").iterdir()) == sorted(names)
    for name in names:
        assert (tmp_path / "a" / "prompts" / name).read_bytes() == (PROMPTS_DIR / name).read_bytes(), name
    # 24 code and math prompts each (n=24), the 12 chat requests there are
    assert [len(load_prompts(task)) for task in TASKS] == [24, 24, 12]


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown task 'poetry'; expected one of code, math, chat"):
        load_prompts("poetry")
