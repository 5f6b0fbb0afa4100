"""The orchestration model's outbox: responses built and sent by one thread, in the order queued.

The response sender is the Python backend's (`pb_utils.InferenceResponseSender`), which exists only
inside a served model's stub; `Sender` stands in for its two methods here, and the served tests
(tests/test_triton.py: eight concurrent streams token for token, a client dropping mid-stream,
tests/test_serve_stop.py) run the outbox behind a real tritonserver."""

from __future__ import annotations

import random
import subprocess
import sys
import threading

from trtspec.triton.outbox import Outbox

FINAL = 1


class Sender:
    """What a request's responses came to: (response, flags, the thread that sent it)."""

    def __init__(self, cancelled: bool = False, fails_at: int | None = None):
        self.got: list[tuple[object, int, str]] = []
        self.cancelled, self.fails_at = cancelled, fails_at

    def is_cancelled(self) -> bool:
        return self.cancelled

    def send(self, response=None, flags: int = 0) -> None:
        if self.fails_at is not None and len(self.got) >= self.fails_at:
            raise RuntimeError("the client went away")
        self.got.append((response, flags, threading.current_thread().name))


def test_each_requests_responses_arrive_in_order_built_on_the_outbox_thread():
    rng = random.Random(7)
    outbox = Outbox(FINAL)
    senders = [Sender() for _ in range(8)]
    steps = [rng.randint(5, 40) for _ in senders]
    built: list[str] = []

    def build(r: int, i: int):
        built.append(threading.current_thread().name)
        return (r, i)

    for i in range(max(steps) + 1):  # one response per running request per step, then the final one
        for r, sender in enumerate(senders):
            if i <= steps[r]:
                outbox.send(sender, lambda r=r, i=i: build(r, i), FINAL if i == steps[r] else 0)
    outbox.close()
    for r, sender in enumerate(senders):
        assert [resp for resp, *_ in sender.got] == [(r, i) for i in range(steps[r] + 1)]
        assert [flags for _, flags, _ in sender.got] == [0] * steps[r] + [FINAL]
    assert set(built) == {"trtspec-send"} and len(built) == sum(steps) + len(steps)


def test_a_failed_send_says_the_client_is_gone_and_the_others_go_on():
    outbox = Outbox(FINAL)
    dropped, kept = Sender(fails_at=2), Sender()
    gone = threading.Event()
    for i in range(5):
        outbox.send(dropped, lambda i=i: i, gone=gone.set)
        outbox.send(kept, lambda i=i: i)
    outbox.send(kept, lambda: "last", FINAL)
    outbox.close()
    assert gone.is_set()
    assert [resp for resp, *_ in dropped.got] == [0, 1]
    assert [resp for resp, *_ in kept.got] == [0, 1, 2, 3, 4, "last"]


def test_a_cancelled_request_gets_the_final_flag_alone():
    outbox = Outbox(FINAL)
    cancelled = Sender(cancelled=True)

    def never():
        raise AssertionError("a cancelled request's final response is not built")

    outbox.send(cancelled, never, FINAL)
    outbox.close()
    assert [(resp, flags) for resp, flags, _ in cancelled.got] == [(None, FINAL)]


def test_queueing_does_not_wait_for_sends_and_close_sends_what_is_queued():
    """A client whose sends hang holds up its own responses, never the loop that queues them."""
    outbox = Outbox(FINAL)
    release = threading.Event()
    stuck = Sender()
    stuck.send = lambda response=None, flags=0, send=stuck.send: (release.wait(5), send(response, flags))
    for i in range(10):
        outbox.send(stuck, lambda i=i: i, FINAL if i == 9 else 0)  # returns while the first send hangs
    assert stuck.got == []
    release.set()
    outbox.close()
    assert [resp for resp, *_ in stuck.got] == list(range(10))


def test_a_first_response_goes_at_once_on_the_callers_thread():
    """A request's first response (nothing of it queued before) is sent before `send` returns: the
    client's first token does not wait for the outbox's thread."""
    outbox = Outbox(FINAL)
    release = threading.Event()
    busy, first = Sender(), Sender()
    busy.send = lambda response=None, flags=0, send=busy.send: (release.wait(5), send(response, flags))
    outbox.send(busy, lambda: "queued")  # the outbox's thread hangs on it
    outbox.send(first, lambda: "first", at_once=True)
    assert first.got == [("first", 0, threading.current_thread().name)]
    outbox.send(first, lambda: "second", FINAL)
    release.set()
    outbox.close()
    assert [resp for resp, *_ in first.got] == ["first", "second"]


def test_an_outbox_never_closed_does_not_keep_its_process_alive():
    """The outbox's thread is a daemon: a process that exits without closing it (a stub whose
    finalize never ran) ends, where the thread waiting for letters would hold it open for ever."""
    code = "from trtspec.triton.outbox import Outbox; box = Outbox(1); print('started')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "started\n", done.stderr
