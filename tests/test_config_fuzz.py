"""Bad build configs and checkpoints never break `trtspec build` or `inspect`: every YAML of
build_configs/ (and a tiny one with most fields set) and the embedded checkpoints' config.json,
mutated at random places (tests/config_fuzz.py), exit 0, or 1 with one `Error:` line, or 2 with
usage; never a traceback, and a failed build leaves no output."""

from __future__ import annotations

from collections import Counter

from . import config_fuzz

RUNS = 300  # ~15 s; `python -m tests.config_fuzz --runs N` runs more


def test_the_seeds_build(tmp_path):
    """The tiny configs build as written (else their mutations would test one refusal)."""
    for config in (config_fuzz.RICH, *(c for c in config_fuzz.CONFIGS if c["name"] == "trtspec")):
        assert [o.exit_code for o in config_fuzz.run_config(config, tmp_path)][0] == 0, config


def test_mutated_configs_and_checkpoints_fail_by_name(tmp_path):
    outcomes = list(config_fuzz.fuzz(RUNS, seed=2026, work=tmp_path))
    problems = [f"{o.problem}\n  {o.command}" for o in outcomes if o.problem]
    assert not problems, "\n".join(problems[:5])
    # the mutations reached each way out: builds that pass, run-time refusals, unreadable configs
    exits = Counter((o.command.split()[0], o.exit_code) for o in outcomes)
    assert exits["build", 0] and exits["build", 1] and exits["build", 2], exits
