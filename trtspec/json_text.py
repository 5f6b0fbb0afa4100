"""JSON text that arrives inside a request or an answer (tool-call arguments, a guide's schema, a
call the model wrote), parsed with every way `json.loads` refuses it as one ValueError: malformed
text (JSONDecodeError, itself a ValueError), an integer past Python's 4,300 digits (ValueError) and
nesting deeper than the interpreter recurses (RecursionError, which is none: uncaught, it was an
HTTP 500 or a traceback in an error message). `depth` measures a parsed value's nesting without
recursing, for the callers that bound it (a JSON schema's grammar costs about its depth squared)."""

from __future__ import annotations

import json
from typing import Any


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
