# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
r"""Text from outside made valid Unicode before it is kept or published.

A Python ``str`` may hold code points no UTF-8 text can: lone surrogates (``"\ud800"`` in
JSON, half of an emoji's escape pair).  rclpy cannot serialize such a string (a publish, a
service response or an action result raises), a logger cannot write it and httpx cannot send
it, so every string the node takes from a server, a model's JSON answer or a sender is passed
through :func:`valid_text` (or :func:`valid_value` for parsed JSON) first: each code point that
cannot be encoded becomes U+FFFD, the replacement character.  Imports nothing of the package.
"""

import json

REPLACEMENT = '\ufffd'


def valid_text(text):
    """``text`` with every code point UTF-8 cannot encode replaced by U+FFFD.

    A surrogate pair held as two code points (an emoji's escape pair, split and joined again)
    becomes the character it encodes; a lone surrogate becomes U+FFFD.
    """
    try:
        text.encode('utf-8')
        return text
    except UnicodeEncodeError:
        # UTF-16 holds surrogates as themselves: pairs decode to their character, and the
        # decoder replaces what is left alone.
        return text.encode('utf-16-le', 'surrogatepass').decode('utf-16-le', 'replace')


def valid_value(value):
    """A JSON value (parsed JSON: dicts, lists, strings, numbers) with its strings valid.

    Keys included; the value itself when every string is valid already.  Through its JSON
    text, so a value nested as deep as the parser allows is never too deep here.
    """
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode('utf-8')
        return value
    except UnicodeEncodeError:
        return json.loads(valid_text(text))
