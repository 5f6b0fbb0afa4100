"""The `trtspec` command's entry point: Ctrl-C held back while a module loads.

A Ctrl-C that lands while Python imports a module (torch's first second, pydantic's, transformers')
breaks that import half-way: a KeyboardInterrupt traceback from the import system, a library that
catches it and goes on without a module it then misses (numpy's "has no attribute 'ndarray'"), one
raised into torch's C++ (`terminate called`), or one swallowed so that the command ran to its end.
One that lands in a finalizer (`__del__`, the `regex` library's) is ignored by Python outright.
Here a Ctrl-C in either place, or before the command runs, waits until the import or finalizer is
done and the command runs, then stops it as any other (`trtspec.cli.common`: one line, exit 130),
saying so if that takes a while (torch and transformers load for about 4 s on a 2-core machine); a
second Ctrl-C while one waits stops it at once, for an import that never ends.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import time

POLL_S = 0.01  # how often a held-back Ctrl-C looks whether the import or finalizer is done
NOTICE_AFTER_S = 0.5  # a Ctrl-C held back longer is answered with a line saying why nothing stopped yet
NOTICE = "Stopping once the libraries have loaded (Ctrl-C again to stop now)."

_held = threading.Event()  # a Ctrl-C is waiting for a safe point
_running = threading.Event()  # the command runs (`running`): before, click would report a Ctrl-C as a failure


@contextlib.contextmanager
def running():
    """Around the command's run (`trtspec.cli.common`, which turns a KeyboardInterrupt into one line
    and exit 130): a Ctrl-C while the CLI loads and parses its arguments waits for it, since click
    would print "Aborted!" and exit 1 there."""
    _running.set()
    try:
        yield
    finally:
        _running.clear()


def _at_unsafe_point(frame) -> bool:
    """Whether the main thread, at `frame`, is not yet running the command or is inside an import or
    a finalizer, where a KeyboardInterrupt would break the module half-loaded or be ignored."""
    if not _running.is_set():
        return True
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith("<frozen importlib._bootstrap") or code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _raise_when_safe() -> None:
    """Wait for the main thread to leave every import and finalizer, then deliver the Ctrl-C to it
    again (`_on_ctrl_c` raises it there then)."""
    main, since, noticed = threading.main_thread(), time.monotonic(), False
    while _held.is_set() and main.is_alive():
        frame = sys._current_frames().get(main.ident)
        if frame is None or not _at_unsafe_point(frame):
            _held.clear()  # no longer held: should the main thread be in an import again, it waits again
            _thread.interrupt_main(signal.SIGINT)
            return
        if not noticed and time.monotonic() - since > NOTICE_AFTER_S:
            print(f"\n{NOTICE}", file=sys.stderr, flush=True)
            noticed = True
        time.sleep(POLL_S)


def _on_ctrl_c(signum, frame) -> None:
    """SIGINT's handler: KeyboardInterrupt now, or once the import or finalizer at `frame` is done;
    a second Ctrl-C while one waits, now."""
    if _held.is_set() or not _at_unsafe_point(frame):
        _held.clear()
        raise KeyboardInterrupt
    _held.set()
    threading.Thread(target=_raise_when_safe, name="ctrl-c", daemon=True).start()


def hold_ctrl_c_in_imports() -> None:
    """Make Ctrl-C wait for imports and finalizers to finish (the process's main thread only, and
    only where Ctrl-C raises KeyboardInterrupt as by default: an ignored SIGINT stays ignored)."""
    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)


def main() -> None:
    """`trtspec`: the CLI (`trtspec.cli.main`), loaded once Ctrl-C waits for imports."""
    hold_ctrl_c_in_imports()
    from trtspec.cli import main as cli

    cli()
