"""What `trtspec serve` decides before any server starts, without one (`trtspec.serve`): which folder
it serves and what it refuses, whether a host reaches only this machine, and the admin-API key that
follows from it. Each case was a change to the module that the served tests (test_triton) passed
(scripts/mutants.py)."""

from __future__ import annotations

import pytest

from trtspec.serve import admin_key_for, is_loopback, model_repository
from trtspec.triton.repo import REPO_DIR
from trtspec.triton.server import ServeError


def _model(repo, name: str, backend: str, versions: dict[str, bool]) -> None:
    """A model folder `repo/name` with a config.pbtxt of `backend`; per version folder, whether it
    holds model.py."""
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "{backend}"\n')
    for version, with_model_py in versions.items():
        (repo / name / version).mkdir()
        if with_model_py:
            (repo / name / version / "model.py").write_text("")


def test_a_path_that_is_no_folder_is_refused_and_a_missing_one_is_told_to_be_built(tmp_path):
    """A file given for DIR is not a folder; a path that does not exist is also told to run `build`."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(ServeError, match=r"file is not a folder: give the output folder of `trtspec build`$"):
        model_repository(tmp_path / "file")
    with pytest.raises(ServeError, match=r"missing is not a folder: .*`trtspec build` \(run it first\)$"):
        model_repository(tmp_path / "missing")


def test_a_folder_without_a_model_names_where_the_model_was_looked_for(tmp_path):
    """A folder holding model_repository/ says it has no model_repository/*/config.pbtxt; one without
    it says neither a model_repository/ nor a */config.pbtxt was found."""
    (tmp_path / "bare").mkdir()
    with pytest.raises(ServeError, match=rf"holds no Triton model \(no {REPO_DIR}/, no \*/config.pbtxt\)"):
        model_repository(tmp_path / "bare")
    (tmp_path / "build" / REPO_DIR).mkdir(parents=True)
    with pytest.raises(ServeError, match=rf"holds no Triton model \(no {REPO_DIR}/\*/config.pbtxt\)"):
        model_repository(tmp_path / "build")


def test_a_python_model_needs_model_py_in_a_version_folder_and_other_backends_none(tmp_path):
    """The repository served is DIR/model_repository, or DIR itself; a Python-backend model needs
    model.py in a numbered version folder (one in another folder, or a file named like a version,
    does not count); a model of another backend needs no model.py."""
    build = tmp_path / "build"
    _model(build / REPO_DIR, "python_ok", "python", {"1": True})
    _model(build / REPO_DIR, "onnx", "onnxruntime", {"1": False})
    assert model_repository(build) == build / REPO_DIR
    direct = tmp_path / "direct"
    _model(direct, "onnx", "onnxruntime", {"1": False})
    assert model_repository(direct) == direct
    stray = tmp_path / "stray"
    _model(stray, "m", "python", {"extra": True})  # model.py, but not under a version folder
    (stray / "m" / "2").write_text("")  # a file named like a version
    with pytest.raises(ServeError, match=r"m has no <version>/model.py \(.*m/1/model.py is missing\)"):
        model_repository(stray)


def test_a_host_is_loopback_when_every_address_it_names_is():
    """Addresses are read as given; names, and the short numeric forms getaddrinfo reads but
    ipaddress does not ("127.1", "10.1"), through getaddrinfo: loopback only when all their
    addresses are. A name that does not resolve reaches no one for sure: not loopback."""
    assert is_loopback("127.0.0.1") and is_loopback("::1") and not is_loopback("0.0.0.0")
    assert is_loopback("localhost")
    assert is_loopback("127.1") and not is_loopback("10.1")
    assert not is_loopback("nohost.invalid")


def test_an_admin_key_is_the_api_key_or_generated_only_off_loopback():
    """The API key when given (whatever the host); none on loopback; a fresh random key, said to be
    generated, on an address other machines reach."""
    assert admin_key_for("0.0.0.0", "k") == ("k", False)
    assert admin_key_for("127.0.0.1", "k") == ("k", False)
    assert admin_key_for("127.0.0.1", None) == (None, False)
    (key, generated), (other, _) = admin_key_for("0.0.0.0", None), admin_key_for("10.1", None)
    assert generated and len(key) == 32 and key != other
