"""JSON text that arrives inside a request or an answer (tool-call arguments, a guide's schema, a
call the model wrote), parsed with every way `json.loads` refuses it as one ValueError: malformed
text (JSONDecodeError, itself a ValueError), an integer past Python's 4,300 digits (ValueError) and
nesting deeper than the interpreter recurses (RecursionError, which is none: uncaught, it was an
HTTP 500 or a traceback in an error message). `depth` measures a parsed value's nesting without
recursing, for the callers that bound it (a JSON schema's grammar costs about its depth squared);
`half_pair` finds a string or key holding half a UTF-16 surrogate pair, which `json.loads` lets
through from a lone `\\ud800` escape (no character: no UTF-8 encodes it, no tokenizer takes it)."""

from __future__ import annotations

import json
import re
from typing import Any

HALF_PAIR = re.compile("[\ud800-\udfff]")  # half a UTF-16 surrogate pair


def loads(text: str | bytes) -> Any:
    """`json.loads(text)`; any refusal a ValueError that says why."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply to parse") from None


def depth(value: Any) -> int:
    """How deep JSON containers nest in `value`: 0 for a scalar, 1 for a flat object or array."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is not None:
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in children)
    return deepest


def half_pair(value: Any) -> tuple[tuple, str, bool] | None:
    """The first string or key of `value` holding half a surrogate pair: (its location, as keys and
    indices from the top; the text; whether it is a key, found in the object at that location), or
    None. Without recursing."""
    stack = [(value, ())]
    while stack:
        node, loc = stack.pop()
        if isinstance(node, str):
            if HALF_PAIR.search(node):
                return loc, node, False
        elif isinstance(node, dict):
            for key, child in node.items():
                if HALF_PAIR.search(key):
                    return loc, key, True
                stack.append((child, (*loc, key)))
        elif isinstance(node, list):
            stack.extend((child, (*loc, i)) for i, child in enumerate(node))
    return None
