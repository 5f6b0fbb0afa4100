"""Random changes to a JSON-like tree (dicts, lists, scalars), the fuzzers' one tool
(tests/api_fuzz.py: request bodies; tests/test_config_fuzz.py: build configs and checkpoints'
config.json): a field dropped, a value of another type or at a boundary, a number's neighbour, a
string with a character slipped in, a list emptied or doubled, an unknown key, a subtree of another
tree."""

from __future__ import annotations

import copy
import random
from dataclasses import dataclass

MAX_DEPTH = 6

# values any field may be given instead of its own: other types, boundaries, odd texts
ODD = [None, True, False, 0, 1, -1, 2, 0.5, -0.5, 1e300, -1e300, 2 ** 31, 2 ** 63, -(2 ** 63), 10 ** 30,
       "", " ", "x", "0", "null", "\u0000", "\ud7ff\ue000", "é" * 3, "{", "}", "\\", "x" * 5000,
       # half a surrogate pair (JSON's "\\ud800"), no character; JSON text nested past what Python
       # parses, and holding an integer past its 4,300 digits (in tool-call arguments, guides)
       "\ud800", "x\udfffy", "[" * 5000 + "]" * 5000, '{"a": ' + "9" * 5000 + "}",
       [], [None], [1, 2], ["a"], [[]], [{}], {}, {"a": 1}, {"": None}]


def places(node, path=()):
    """Every (path, value) in the tree, the root included, down to MAX_DEPTH."""
    yield path, node
    if len(path) >= MAX_DEPTH:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            yield from places(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from places(value, (*path, i))


@dataclass
class Mutator:
    """Changes trees with values of `odd` (besides ODD), subtrees of `donors` and new keys of
    `keys`."""

    odd: list
    donors: list
    keys: list[str]

    def value(self, rng: random.Random, old) -> object:
        """A value to put where `old` was: mostly an odd one, sometimes a near neighbour of a
        number, an edited string, or a subtree of a donor."""
        roll = rng.random()
        if isinstance(old, bool) or roll < 0.45:
            return copy.deepcopy(rng.choice(self.odd if rng.random() < 0.5 else ODD))
        if isinstance(old, (int, float)) and roll < 0.85:
            return rng.choice([old - 1, old + 1, -old, old * 1000, old / 3, int(old) + 0.5])
        if isinstance(old, str) and roll < 0.85:
            cut = rng.randrange(len(old) + 1)
            # digits to Python's str.isdigit() that int() or the API does not take: "²", "٣"
            slipped = rng.choice(["", "\n", "é", "\x00", "}", '"', "<", "\\u0000", "🦀", "²", "٣", "\ud800"])
            return old[:cut] + slipped + old[cut:]
        return copy.deepcopy(rng.choice(list(places(rng.choice(self.donors))))[1])

    def mutate(self, rng: random.Random, tree: dict, count: int) -> dict:
        """`tree` changed at `count` random places (a copy)."""
        tree = copy.deepcopy(tree)
        for _ in range(count):
            inner = list(places(tree))[1:]
            if not inner:
                break
            path, old = rng.choice(inner)
            parent = tree
            for key in path[:-1]:
                parent = parent[key]
            op, key = rng.random(), path[-1]
            if op < 0.2:  # drop it
                del parent[key]
            elif op < 0.3 and isinstance(old, list):
                parent[key] = old + copy.deepcopy(old) if rng.random() < 0.5 else []
            elif op < 0.4 and isinstance(old, dict):
                old[rng.choice(self.keys)] = copy.deepcopy(rng.choice(self.odd + ODD))
            else:
                parent[key] = self.value(rng, old)
        return tree
