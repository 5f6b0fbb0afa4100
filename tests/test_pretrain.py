"""The embedded-model recipe: the overshoot correction's inputs and labels, and a staged run."""

from __future__ import annotations

import json
import os
import random
import re
import resource
import shutil
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.errors import TrtspecError
from trtspec.train.corpus import (
    _is_heldout,
    arithmetic_problem,
    arithmetic_text,
    stdlib_files,
    stdlib_text,
    training_corpus,
)
from trtspec.train.overshoot import IGNORE, SPACE, overshoot_window
from trtspec.train.pretrain import PretrainConfig, pretrain

ASSETS = Path(__file__).parent.parent / "trtspec" / "assets"


def _window(rng: random.Random, seq_len: int) -> list[int]:
    """Random code-like bytes with a few indented lines, `seq_len + 1` long."""
    out = b""
    while len(out) < seq_len + 1:
        indent = rng.choice([0, 4, 8, 13, 27])
        out += b" " * indent + bytes(rng.choice(b"abc(),=:") for _ in range(rng.randint(1, 30))) + b"\n"
    return list(out[: seq_len + 1])


def _ignored_spans(labels: list[int]) -> list[tuple[int, int]]:
    spans, i = [], 0
    while i < len(labels):
        if labels[i] == IGNORE:
            j = i
            while j + 1 < len(labels) and labels[j + 1] == IGNORE:
                j += 1
            spans.append((i, j))
            i = j
        i += 1
    return spans


@pytest.mark.parametrize("seed", range(20))
def test_overshoot_window_masks_the_inserted_spaces_and_keeps_every_other_label(seed):
    rng = random.Random(seed)
    seq_len = 96
    window = _window(rng, seq_len)
    inputs, labels = overshoot_window(window, seq_len, max_extra=32, rng=rng)
    assert len(inputs) == len(labels) == seq_len
    spans = _ignored_spans(labels)
    assert spans
    inserted = set()
    for a, b in spans:
        # a: the line's last real space; a+1 .. b+1: the k = b-a+1 inserted spaces
        assert inputs[a] == SPACE and all(x == SPACE for x in inputs[a + 1 : b + 2])
        inserted.update(range(a + 1, b + 2))
        if b + 1 < seq_len:
            assert labels[b + 1] not in (SPACE, IGNORE), "the stop label: the line's first byte"
    real = [x for i, x in enumerate(inputs) if i not in inserted]
    assert real == window[: len(real)], "without the inserted spaces the input is the window"
    for i in range(seq_len - 1):
        if labels[i] != IGNORE:
            assert labels[i] == inputs[i + 1], f"label {i} is the next input byte"


@pytest.mark.parametrize("seed", range(10))
def test_stop_every_labels_each_overshot_position_with_the_lines_first_byte(seed):
    window = _window(random.Random(seed), 96)
    inputs, last = overshoot_window(window, 96, max_extra=32, rng=random.Random(seed + 100))
    same_inputs, every = overshoot_window(window, 96, 32, random.Random(seed + 100), stop_every=True)
    assert same_inputs == inputs, "the variant changes labels only"
    spans = _ignored_spans(last)
    for a, b in spans:
        stop = last[b + 1] if b + 1 < len(last) else every[a]
        assert every[a : b + 1] == [stop] * (b - a + 1), "each overshot position predicts the stop"
        assert stop != SPACE
    masked = {i for a, b in spans for i in range(a, b + 1)}
    assert all(every[i] == last[i] for i in range(len(last)) if i not in masked)
    assert IGNORE not in every[: spans[-1][0]], "no label is ignored before the last overshoot"


def test_overshoot_window_needs_an_indented_line_to_extend():
    rng = random.Random(0)
    assert overshoot_window(list(b"abc def\nxyz\n" * 4), 40, 8, rng) is None
    assert overshoot_window(_window(rng, 64), 64, 8, rng, line_share=0.0) is None


def test_a_line_starting_at_the_windows_last_byte_is_not_extended_one_before_it_is():
    """Extra spaces before the window's last byte would show in no input, only mask the last label:
    such a line is never chosen; a line whose first byte is the second to last is."""
    rng = random.Random(0)
    assert overshoot_window(list(b"abc\n    x"), 8, 8, rng) is None
    inputs, labels = overshoot_window(list(b"abc\n    xy"), 9, 8, rng)
    assert inputs == list(b"abc\n     ") and labels[:8] == [*b"bc\n    ", IGNORE]


def test_only_the_positions_before_inserted_spaces_are_ignored_whatever_the_bytes():
    """IGNORE (the loss's ignore_index) is no byte: a line holding every non-space byte keeps each
    one's label, and the ignored labels are the k positions before the k inserted spaces."""
    body = bytes(b for b in range(256) if not bytes([b]).isspace())
    window = list(b"if x:\n    " + body)
    inputs, labels = overshoot_window(window, len(window) - 1, 8, random.Random(0))
    k = inputs.index(body[0]) - 10  # the body's first byte follows 4 + k spaces
    assert 1 <= k <= 8 and inputs[: 10 + k] == list(b"if x:\n    ") + [SPACE] * k
    assert [i for i, x in enumerate(labels) if x == IGNORE] == list(range(9, 9 + k))
    assert all(labels[i] == inputs[i + 1] for i in range(len(labels) - 1) if labels[i] != IGNORE)


def test_the_extra_spaces_are_one_to_max_extra_each():
    """k is drawn in [1, max_extra] and every value in it occurs: 1 (no shorter overshoot) and
    max_extra alike."""
    window = list(b"if x:" + b"\n  x" * 200)
    inputs, _ = overshoot_window(window, len(window) - 1, 4, random.Random(0))
    ks = [len(m.group(1)) - 2 for m in re.finditer(rb"\n( +)x", bytes(inputs))]
    assert len(ks) > 100 and set(ks) == {1, 2, 3, 4}


def test_a_second_stage_continues_the_first_and_records_it(tmp_path):
    tiny = dict(steps=2, batch_size=2, seq_len=32, eval_every=1)
    pretrain(tmp_path / "one", PretrainConfig(**tiny))
    pretrain(tmp_path / "two", PretrainConfig(**tiny, init_from=tmp_path / "one", overshoot_share=0.5))
    report = json.loads((tmp_path / "two" / "tiny-target" / "training.json").read_text())
    assert report["recipe"]["overshoot_share"] == 0.5
    assert report["previous_stage"]["recipe"]["init_from"] is None
    assert report["previous_stage"]["history"][-1]["step"] == 2
    draft = json.loads((tmp_path / "two" / "tiny-draft" / "training.json").read_text())
    assert draft["parameters"] < report["parameters"]
    for stage in (report, draft):  # each model keeps its own first stage
        assert stage["previous_stage"]["parameters"] == stage["parameters"]
    umask = os.umask(0)
    os.umask(umask)
    for file in (tmp_path / "two").glob("*/*"):  # readable as any plain write makes a file
        assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file.name


def test_init_from_a_folder_without_weights_is_one_line(tmp_path):
    result = CliRunner().invoke(main, ["train", "target", "--out", str(tmp_path / "o"), "--steps", "1",
                                       "--init-from", str(tmp_path)])
    assert result.exit_code == 2
    assert "tiny-target: no model.safetensors" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("damage, blamed", [
    ("torn", "tiny-target/model.safetensors: a weight file cannot be read"),
    ("no config", "tiny-draft/config.json is missing"),  # transformers built a default 8B Qwen3: killed
    ("bad report", "tiny-target/training.json is not valid JSON"),
])
def test_init_from_a_damaged_stage_is_one_line_naming_the_file(tmp_path, damage, blamed):
    """Each was a traceback (a SafetensorError; "Expecting value: line 1 column 1" naming no file),
    or, with no config.json, a process the kernel killed for memory."""
    stage = tmp_path / "stage"
    for name in ("tiny-target", "tiny-draft"):
        shutil.copytree(ASSETS / name, stage / name)
    if damage == "torn":
        os.truncate(stage / "tiny-target" / "model.safetensors", 1000)
    elif damage == "no config":
        (stage / "tiny-draft" / "config.json").unlink()
    else:
        (stage / "tiny-target" / "training.json").write_text("garbage{")
    result = CliRunner().invoke(main, ["train", "target", "--out", str(tmp_path / "o"), "--steps", "1",
                                       "--init-from", str(stage)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {stage}/{blamed}"), result.output
    assert result.output.count("\n") == 1
    assert not (tmp_path / "o").exists()


def _files(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_stage_that_fails_while_saved_leaves_no_half_of_a_folder(tmp_path):
    """`train target` saved each model straight into its folder: a save that failed (here a
    file-size limit of 4 MB that the 17 MB target's weights pass, as a full disk would) was a
    SafetensorError traceback after the training, and left in a new --out a tiny-target/ holding
    config.json and generation_config.json but no weights (an earlier stage's had those two files
    rewritten, its weights kept). Both folders are now written beside their places and swapped in
    once complete."""
    tiny = dict(steps=1, batch_size=2, seq_len=32, eval_every=1)
    stage = tmp_path / "stage"  # an earlier stage: the shipped one
    for name in ("tiny-target", "tiny-draft"):
        shutil.copytree(ASSETS / name, stage / name)
    before = _files(stage)

    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, hard))  # Python ignores SIGXFSZ: writes fail, EFBIG
    try:
        errors = []
        for out in (stage, tmp_path / "new"):
            with pytest.raises(TrtspecError) as error:
                pretrain(out, PretrainConfig(**tiny, seed=3))
            errors.append(str(error.value))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert errors[0].startswith(f"{stage / 'tiny-target'}: cannot write it ("), errors[0]
    assert errors[0].endswith(f"; {stage} keeps what it held before this run")
    assert _files(stage) == before
    assert sorted(p.name for p in stage.iterdir()) == ["tiny-draft", "tiny-target"]  # no temporary folder
    assert list((tmp_path / "new").iterdir()) == []


def test_a_model_folder_that_is_a_file_is_refused_before_training(tmp_path):
    """Found only when the models were saved, after the training."""
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "tiny-draft").write_text("mine")
    result = CliRunner().invoke(main, ["train", "target", "--out", str(tmp_path / "o"), "--steps", "1"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"Error: {tmp_path / 'o' / 'tiny-draft'} is a file; `train target --out` needs" in result.output
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["tiny-draft"]


_STEP = re.compile(r"(\d+)([+-])(\d+)(?:([+-])1)?=(\d+)(?: (carry|borrow) 1)?")


def test_every_worked_arithmetic_step_is_right_and_carries_into_the_next():
    """The steps a tiny model learns from: each column's sum or difference is right, a carry (a
    borrow) is written exactly where the column overflows (goes below 0) and is added (taken) in
    the next column, and the answer is the question's; operands stay in their ranges."""
    rng, kinds = random.Random(5), set()
    for _ in range(600):
        question, answer, rest = arithmetic_problem(rng).split("\n")
        assert rest == "" and question.startswith("Q: ") and answer.startswith("A: ")
        a, op, b = question[3:].split(" ")
        a, b, kinds = int(a), int(b), kinds | {op}
        want = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert answer.endswith(f" = {want}")
        if op == "*":
            assert 11 <= a <= 99 and 2 <= b <= 9
            tens, ones = a // 10 * 10, a % 10
            assert answer == f"A: {tens}*{b} + {ones}*{b} = {tens * b} + {ones * b} = {a * b}"
            continue
        assert (10 <= a <= 999 and 10 <= b <= 999) if op == "+" else 1 <= b <= a <= 999
        steps, carry, digits = answer[3:].split("; ")[:-1], 0, []
        assert len(steps) == len(str(max(a, b) if op == "+" else a))
        for i, step in enumerate(steps):
            x, sign, y, extra, result, flag = _STEP.fullmatch(step).groups()
            x, y, result = int(x), int(y), int(result)
            assert sign == op and (extra is not None) == bool(carry) and (extra in (None, op))
            assert y == (b // 10**i) % 10
            if op == "+":
                assert x == (a // 10**i) % 10 and result == x + y + carry
                carry = result // 10
                assert (flag == "carry") == bool(carry) and flag != "borrow"
                digits.append(result % 10)
            else:
                assert x % 10 == (a // 10**i) % 10 and result == x - y - carry and 0 <= result <= 9
                assert (flag == "borrow") == (x >= 10) and flag != "carry"
                carry = int(x >= 10)
                digits.append(result)
        assert not (op == "-" and carry)  # the difference is never negative
        overflow = 10 ** len(steps) if op == "+" and carry else 0  # a last carry: one more digit
        assert int("".join(map(str, reversed(digits)))) + overflow == want
    assert kinds == {"+", "-", "*"}


def test_train_and_heldout_split_files_and_problems_by_their_stable_hash():
    """A file or a question is held out iff its hash says so, whichever split asked: the two splits
    never share one; the stdlib's test suites (test/, any tests/ folder) are in neither."""
    root = Path(sysconfig.get_paths()["stdlib"])
    heldout = [p.relative_to(root).as_posix() for p in stdlib_files("heldout")]
    assert heldout == sorted(heldout) and len(heldout) > 20 and all(_is_heldout(rel) for rel in heldout)
    assert not [rel for rel in heldout if rel.startswith(("test/", "tests/")) or "/tests/" in rel]
    for split, text in (("train", arithmetic_text("train", 3000, seed=2)),
                        ("heldout", arithmetic_text("heldout", 3000, seed=2))):
        questions = [line for line in text.decode().splitlines() if line.startswith("Q: ")]
        assert 3000 <= len(text) < 3000 + 100 and text.endswith(b"\n")
        assert all(_is_heldout(q) == (split == "heldout") for q in questions), split
    # "about num_bytes": problems until the bytes reach it, not one more nor one fewer
    first = arithmetic_text("train", 1, seed=2)
    assert first.count(b"Q: ") == 1 and arithmetic_text("train", len(first), seed=2) == first
    assert arithmetic_text("train", len(first) + 1, seed=2).count(b"Q: ") == 2


def test_the_corpus_is_the_split_s_code_then_arithmetic_making_up_its_fraction():
    code = stdlib_text("heldout")
    assert code.endswith(b"\n\n") and b"\n\n\n\n" not in code[-4:]
    corpus = training_corpus("heldout", 0.03, seed=4)
    want = int(len(code) * 0.03 / 0.97)
    assert corpus[: len(code)] == code
    assert corpus[len(code):] == arithmetic_text("heldout", want, seed=4)
    assert want <= len(corpus) - len(code) < want + 100
