"""Text fidelity, as property tests over random token ids: what a served answer says is built a
few ids at a time (`TextStream` in the served model, `StopTrimmer` and `_Run` in the OpenAI
frontend), and must not depend on how the ids arrive or on whether the answer streams.

Tokenizers: the embedded models' bytes, a byte-level BPE (Llama 3's kind), a SentencePiece one
that drops a text's first space (metaspace) and one with byte fallback (Llama 2's, Mistral's).
Random ids mix encoded text of 1- to 4-byte characters and combining marks, ids drawn anywhere
in the vocabulary (special tokens, pieces of characters, invalid byte sequences) and end ids.
"""

from __future__ import annotations

from trtspec.openai.stops import StopTrimmer


def test_overlapping_stop_strings_cut_at_the_first_completed():
    """'bc' is complete at 'c', before 'abcd' is: the answer is 'xa' whether it comes whole or in
    pieces (whole it was 'x': the stop string that starts first was taken)."""
    for pieces in (["xabcdy"], ["xab", "cdy"], list("xabcdy")):
        trim = StopTrimmer(["abcd", "bc"])
        got = "".join(trim.push(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces))
        assert (got, trim.stopped) == ("xa", True), pieces
    trim = StopTrimmer(["c", "bc"])  # completed at the same character: the longer
    assert trim.push("abcd", final=True) == "a"
