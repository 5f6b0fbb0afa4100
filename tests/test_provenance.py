"""A generated report names the revision it was measured at (trtspec.provenance)."""

from __future__ import annotations

import subprocess

from trtspec.provenance import SOURCE, source_revision


def _git(root, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def test_the_revision_is_the_checkouts_commit_marked_when_tracked_files_changed(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "first")
    commit = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert source_revision(tmp_path) == commit
    (tmp_path / "untracked.txt").write_text("not part of the source\n")
    assert source_revision(tmp_path) == commit
    (tmp_path / "a.txt").write_text("two\n")
    assert source_revision(tmp_path) == commit + "+changes"


def test_no_revision_outside_a_checkout_or_inside_someone_elses(tmp_path):
    assert source_revision(tmp_path) is None  # not a git checkout at all
    _git(tmp_path, "init", "-q")
    inner = tmp_path / "site-packages"
    inner.mkdir()
    assert source_revision(inner) is None  # a package folder inside another project's checkout


def test_this_checkout_has_one():
    assert (SOURCE / "trtspec").is_dir()
    revision = source_revision()
    assert revision is None or revision.split("+")[0] == _git(SOURCE, "rev-parse", "--short", "HEAD")


def test_version_names_the_installed_release_and_the_checkouts_commit():
    """`trtspec --version` (every CLI a user knows has one; it was "No such option"): the installed
    version and the commit a checkout runs, before any command loads a model."""
    from importlib.metadata import version

    from click.testing import CliRunner

    from trtspec.cli import main

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    revision = source_revision()  # None where CI runs from a copy without .git
    source = f" (source {revision})" if revision else ""
    assert result.output == f"trtspec {version('trtspec')}{source}\n"
    assert "--version" in CliRunner().invoke(main, ["--help"]).output
