"""OpenAI's `stop` cut out of the text (`StopTrimmer`) while streaming, and at its edges: a stop
sequence at the very start, one ending right at or right past min_tokens' text, the tail held back
while it may still start the longest stop sequence, and nothing more once stopped."""

from __future__ import annotations

from trtspec.openai.stops import StopTrimmer


def test_stop_sequences_are_cut_and_held_back_while_streaming():
    trim = StopTrimmer(["\nQ:", "END"])
    sent = [trim.push(t) for t in ["= 8", "38\n", "Q", ": 9"]]
    assert sent == ["= 8", "38", "", ""] and trim.stopped  # "\n" then "Q" held until decided
    trim = StopTrimmer(["\nQ:"])
    assert [trim.push("a\n"), trim.push("b"), trim.push("\n", final=True)] == ["a", "\nb", "\n"]
    # min_tokens: no stop sequence ends within the first tokens' text (`protected`, None until known)
    trim = StopTrimmer([";"], protected=None)
    assert trim.push("8; 1") == "8; 1" and not trim.stopped
    trim.protected = 6  # "8; 1; "
    assert [trim.push("; 2"), trim.push("; 3")] == ["; 2", ""] and trim.stopped


def test_a_stop_sequence_at_the_very_start_leaves_an_empty_answer():
    trim = StopTrimmer([";"])
    assert (trim.push(";x"), trim.stopped, trim.matched) == ("", True, ";")


def test_nothing_is_sent_once_stopped():
    trim = StopTrimmer([";"])
    assert [trim.push("a;b"), trim.push("c"), trim.push("d", final=True)] == ["a", "", ""]


def test_a_stop_ending_within_min_tokens_text_is_answer_and_the_next_one_past_it_stops():
    """protected = 2: the ';' ending at character 2 was written by the first min_tokens tokens, the
    ';' ending at character 3 is the first that counts."""
    trim = StopTrimmer([";"], protected=2)
    assert (trim.push("8;;x"), trim.stopped) == ("8;", True)
    # the same when the first piece was sent already (`sent` counts it)
    trim = StopTrimmer([";"], protected=2)
    assert [trim.push("8"), trim.push(";;x")] == ["8", ";"] and trim.stopped


def test_a_whole_stop_within_min_tokens_text_is_not_held_back():
    """It can no longer become a stop: sent at once, not held for the next text."""
    trim = StopTrimmer([";"], protected=2)
    assert (trim.push("8;"), trim.stopped) == ("8;", False)


def test_the_tail_that_may_start_the_longest_stop_is_held_back():
    trim = StopTrimmer(["x", "abc"])  # a shorter stop beside it holds back no less
    assert [trim.push("1ab"), trim.push("c")] == ["1", ""] and trim.matched == "abc"
    trim = StopTrimmer(["abc"])
    assert [trim.push("xa"), trim.push("bd")] == ["x", "abd"] and not trim.stopped
    trim = StopTrimmer(["abcd"])
    assert trim.push("1abc") == "1" and trim.push("e", final=True) == "abce"
    trim = StopTrimmer(["abcd"])
    assert trim.push("12a") == "12"  # one character of it


def test_of_stops_in_one_piece_the_first_to_end_is_the_one_that_stops():
    """Streamed a character at a time, "bc" would end the text before "abcd" was whole: a piece
    holding both is cut at "bc" (before it, or after it where it is included), whichever stop is
    listed first or starts first."""
    for stops in (["abcd", "bc"], ["bc", "abcd"]):
        trim = StopTrimmer(stops)
        assert (trim.push("xabcdy"), trim.matched) == ("xa", "bc")
        trim = StopTrimmer(stops, include=frozenset(stops))  # include_stop_str_in_output
        assert (trim.push("xabcdy"), trim.matched) == ("xabc", "bc")
