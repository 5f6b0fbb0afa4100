"""The negative control of the shipped drafters' sampling-law tests (tests/test_lossless.py): the same
check, with the deliberately biased acceptance rule (`trtspec.spec.biased_verify`, min(1, p/2q))
in place of the real one, must fail. Runs it one request at a time and 16 at a time (what the test
runs) for each drafter and prints the TV of the first position over the test's bound, or that the
biased rule passed (a test blind to that bias).

    .venv/bin/python scripts/biased_law_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_lossless import _assert_samples_follow_target, _shipped_decoder  # noqa: E402
from trtspec.spec.biased_verify import BiasedVerifier  # noqa: E402
from trtspec.spec.sampling import SamplingParams  # noqa: E402

PROMPT = list(b"    def __init__(self")  # the test's prompt, sampling and steps
SAMPLING = SamplingParams(temperature=1.0, top_k=3)


def main() -> None:
    for name in ("tiny-dflash", "tiny-eagle3", "tiny-dspark"):
        for slots in (1, 16):
            model, spec = _shipped_decoder(name, slots=slots)
            spec.verifier = BiasedVerifier()
            try:
                _assert_samples_follow_target(model, spec, PROMPT, SAMPLING, steps=4)
                verdict = "PASSED the biased rule"
            except AssertionError as exc:
                position, tv = exc.args[0]
                verdict = f"fails it: TV {tv:.4f} at position {position} (bound 0.06)"
            print(f"{name:12s} R = {slots:2d}: {verdict}", flush=True)


if __name__ == "__main__":
    main()
