"""trtspec.files: files and folders written whole into folders that may not exist yet, over what was
there (a file, a folder, a link), and the file system's length limits named exactly at their edge."""

from __future__ import annotations

from trtspec.files import NAME_MAX, PATH_MAX, replaced_dir, too_long, write_text


def test_write_text_makes_the_missing_folders_and_writes_over_the_file_there(tmp_path):
    path = tmp_path / "a" / "b" / "f.txt"  # neither a nor b exists yet
    write_text(path, "one")
    write_text(path, "two")  # the folders exist now: taken as they are
    assert path.read_text() == "two"
    assert [p.name for p in path.parent.iterdir()] == ["f.txt"]  # no temporary file left


def _replaced(path, name: str) -> list[str]:
    """`path` replaced by a folder holding one file `name`; -> the names in `path` after."""
    with replaced_dir(path) as tmp:
        (tmp / name).write_text("x")
    return [p.name for p in path.iterdir()]


def test_replaced_dir_takes_the_place_of_a_folder_a_file_or_a_link(tmp_path):
    made = tmp_path / "a" / "b" / "model"  # neither a nor b exists yet
    assert _replaced(made, "new") == ["new"]
    made.mkdir(exist_ok=True)
    assert _replaced(made, "newer") == ["newer"]  # an earlier folder's contents are gone

    file = tmp_path / "file"
    file.write_text("old")
    assert _replaced(file, "new") == ["new"]

    kept = tmp_path / "kept"  # a link to a folder: the link is replaced, the folder it named kept
    kept.mkdir()
    (kept / "theirs").write_text("z")
    link = tmp_path / "link"
    link.symlink_to(kept)
    assert _replaced(link, "new") == ["new"] and not link.is_symlink()
    assert [p.name for p in kept.iterdir()] == ["theirs"]

    dangling = tmp_path / "dangling"  # a link to nothing (exists() is False) is replaced too
    dangling.symlink_to(tmp_path / "nowhere")
    assert _replaced(dangling, "new") == ["new"] and not dangling.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "dangling", "file", "kept", "link"]


def test_too_long_is_none_up_to_each_limit_and_says_why_past_it():
    # "/" + "d/" * 2047 is 1 + 4094 = 4095 bytes, the most a path may have; one "d" more is over
    at_limit = "/" + "d/" * 2047
    assert len(at_limit) == PATH_MAX and too_long(at_limit) is None
    assert too_long(at_limit + "d") == "is 4,096 bytes long, over the 4,095 a path may have"
    assert too_long("/x/" + "n" * NAME_MAX) is None
    assert too_long("/x/" + "n" * (NAME_MAX + 1)) == \
        "holds a name of 256 bytes, over the 255 a file or folder name may have"
