# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""JSON from outside, read within bounds: nesting depth, and every error as a ``ValueError``.

``json.loads`` recurses once per level of nesting: 4 KB of ``[`` raise ``RecursionError``
(not a ``ValueError``) out of whatever called it, and a structure a little less deep parses,
then recurses again in every consumer (``json.dumps``, llguidance's converter, which crashes
the whole process on a dict some tens of thousands of levels deep). Every JSON text taken from
outside (the ``prompt/json`` envelope, the ``response_format`` parameter, ``orin_llm_chat
--schema``) is read with :func:`loads`; the engine checks a ``response_format`` given as a
dict with :func:`depth`. Imports nothing of the package.
"""

import json

#: The deepest nesting of objects and arrays taken: llguidance's own limit for a grammar
#: (serde_json's recursion limit), far more than any real schema needs.
MAX_DEPTH = 128


def depth(value, limit=MAX_DEPTH):
    """How deeply ``value``'s dicts, lists and tuples nest (a scalar: 0).

    Iterative (no recursion, whatever the depth); the count stops once it passes ``limit``,
    so a structure that contains itself is simply too deep.
    """
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def too_deep(limit=MAX_DEPTH):
    """The reason given for a value nested deeper than ``limit``."""
    return f'nested more than {limit} levels deep'


def loads(text, limit=MAX_DEPTH):
    """``json.loads(text)``; ``ValueError`` with the reason for anything it cannot take.

    Refused: text that is not JSON (an integer of more than 4300 digits included), and values
    nested deeper than ``limit`` (``RecursionError`` included, whatever the interpreter's
    recursion limit).
    """
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(too_deep(limit)) from None
    except ValueError as exc:
        raise ValueError(f'not JSON: {exc}') from None
    if depth(value, limit) > limit:
        raise ValueError(too_deep(limit))
    return value
