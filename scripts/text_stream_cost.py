"""What streaming detokenization costs the serving loop: `TextStream` (incremental) against
decoding the whole output again at every id, on a 2,048-token answer pushed 4 ids per step
with a BPE tokenizer (the test suite's miniature of Llama 3.1's, `tests/bpe_checkpoint.py`).

    .venv/bin/python scripts/text_stream_cost.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.bpe_checkpoint import VOCAB, write_bpe_target  # noqa: E402
from trtspec.tokenizer import HFTokenizer  # noqa: E402
from trtspec.triton.request import TextStream  # noqa: E402


def decode_all_every_id(decode, ids: list[int], stops: tuple[str, ...]) -> str:
    """The reference: the whole text decoded again after every id (for stop words) or step."""
    text = ""
    for i in range(0, len(ids), 4):
        for n in range(i + 1, min(i + 4, len(ids)) + 1):
            if stops and any(w in decode(ids[:n]) for w in stops):
                return decode(ids[:n])
        text = decode(ids[: i + 4])
    return text


def incremental(decode, ids: list[int], stops: tuple[str, ...]) -> str:
    stream, text = TextStream(decode, stops), ""
    for i in range(0, len(ids), 4):
        text += stream.push(ids[i : i + 4])[0]
        if stream.stopped:
            break
    return text + stream.finish()


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    write_bpe_target(folder / "target", folder / "draft")
    decode = HFTokenizer(folder / "target", VOCAB + 8).decode
    ids = [random.Random(0).randrange(6, VOCAB) for _ in range(2048)]
    for stops in ((), ("never in the text",)):
        times = {}
        for name, run in (("decode all", decode_all_every_id), ("TextStream", incremental)):
            start = time.perf_counter()
            times[name] = (run(decode, ids, stops), time.perf_counter() - start)
        same = times["decode all"][0] == times["TextStream"][0]
        print(f"stop words {list(stops)}: decode all at every id {times['decode all'][1] * 1e3:.0f} ms, "
              f"TextStream {times['TextStream'][1] * 1e3:.0f} ms, same text: {same}")


if __name__ == "__main__":
    main()
