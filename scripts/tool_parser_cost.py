"""What the streaming tool-call parsers cost on a long call: one tool call that writes a
100,000-character file, pushed through `ToolParser` in 4-character pieces (a decode step's text),
for each format. Each time should grow with the text, not its square: the frontend runs them on
its event loop.

    .venv/bin/python scripts/tool_parser_cost.py
"""

from __future__ import annotations

import json
import random
import time

from trtspec.openai.tools import ToolParser, tool_plan

TOOLS = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "content": {"type": "string"}}}}}]
PIECE = 4


def main() -> None:
    content = "".join(random.Random(0).choice("abcdefgh ij\n{}[]\"\\<>/") for _ in range(100_000))
    arguments = {"path": "a.py", "content": content}
    texts = {
        "hermes": "<tool_call>\n" + json.dumps({"name": "write", "arguments": arguments}) + "\n</tool_call>",
        "llama3_json": json.dumps({"name": "write", "parameters": arguments}),
        "required": json.dumps([{"name": "write", "parameters": arguments}]),
        "qwen3_coder": "<tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n"
                       "<parameter=content>\n" + content + "\n</parameter>\n</function>\n</tool_call>",
    }
    for name, text in texts.items():
        plan = tool_plan(TOOLS, "required", None, None) if name == "required" else \
            tool_plan(TOOLS, "auto", None, name)
        parser = ToolParser(plan)
        pieces = [text[i:i + PIECE] for i in range(0, len(text), PIECE)]
        start = time.perf_counter()
        for piece in pieces:
            parser.push(piece)
        parser.finish()
        took = time.perf_counter() - start
        print(f"{name}: {len(text):,} characters in {len(pieces):,} pieces: {took:.2f} s")


if __name__ == "__main__":
    main()
