# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The checks of the parameters whose values are more than a type and a range.

Each ``*_problem`` function returns why a value cannot be used (one line), or None; the
parameter table (parameters.py) names them. No rclpy, no checkpoint: the engine's own checks of
a loaded checkpoint are ``parameters.check_loaded``.
"""

from pathlib import Path
import re

from orin_llm_node import bounded_json
from orin_llm_node.refusals import REASON_CHARS, clip

# Longest prompt, prompt/json message and response_format value taken (characters).
MAX_PROMPT_CHARS = 100_000
# Longest tools value taken (characters of JSON): they are rendered into every conversation's
# system turn, so they cost context and prefill on each new conversation.
MAX_TOOLS_CHARS = 32_000
MAX_CAMERAS = 8
# A relative or absolute ROS topic name made of plain tokens (no substitutions, no '~').
_TOPIC_NAME = re.compile(r'/?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*')


def model_path_problem(v):
    """Why ``model_path`` value ``v`` cannot be loaded (None: it can)."""
    if v == '' or (Path(v).expanduser() / 'config.json').is_file():
        return None
    return 'must be empty (demo checkpoint) or a checkpoint directory containing config.json'


def camera_topics(name):
    """The topics camera ``name`` is read from: ``NAME`` (Image) and ``NAME/compressed``."""
    return name, f'{name}/compressed'


def topic_names_problem(names):
    """Why ``image_topics`` value ``names`` cannot name the cameras (None: it can)."""
    if not 1 <= len(names) <= MAX_CAMERAS:
        return f'must name 1 to {MAX_CAMERAS} cameras'
    bad = [n for n in names if not isinstance(n, str) or not _TOPIC_NAME.fullmatch(n)]
    if bad:
        return f'{bad[0]!r} is not a topic name (tokens of letters, digits and _ joined by /)'
    if len(set(names)) != len(names):
        return 'names a camera twice'
    twins = {camera_topics(n)[1]: n for n in names}
    clash = next((n for n in names if n in twins), None)
    if clash is not None:
        return (f'camera {clash!r} is the CompressedImage topic of camera {twins[clash]!r} '
                '(each camera NAME is also read on NAME/compressed)')
    return None


# The parameters that hold JSON text, each with an example.  ros2 param set and params files
# read a value as YAML, where an unquoted {...} is a mapping (ros2cli fails on it; a params
# file makes it nested parameters) and [...] a list: the JSON must be a quoted YAML string.
JSON_TEXT_EXAMPLES = {'response_format': '{"type": "json_object"}',
                      'tools': '[{"name": "stop", "description": "Stop the arm."}]'}


def quoting_hint(name):
    """How to give JSON-text parameter ``name`` from a shell and in a params file (one line)."""
    example = JSON_TEXT_EXAMPLES[name]
    shell = example.replace('"', '\\"')
    return (f"{name} is JSON text, and ros2 param set and params files read a value as YAML: "
            f"quote it as a YAML string, e.g. ros2 param set <node> {name} \"'{shell}'\" or, in "
            f"a params file, {name}: '{example}'")


def one_line(exc):
    """A refusal's reason (an exception) on one line, cut to REASON_CHARS."""
    return clip(' '.join(str(exc).split()), REASON_CHARS)


def json_value(text):
    """A JSON-text parameter (``response_format``, ``tools``) as a value (empty: None).

    ``ValueError`` for text that is not JSON or is nested too deep (``bounded_json``).
    """
    return bounded_json.loads(text) if text else None


# The names the parameter table and its callers read the two JSON-text parameters by
# (``tools``: ``[]`` means none as well).
response_format = tools_value = json_value


def response_format_problem(v):
    """Why ``response_format`` text ``v`` cannot constrain answers (None: it can)."""
    # The library compiles the grammar without a vocabulary here (no checkpoint is loaded at
    # start-up or in orin_llm_check); the loaded engine's own compile: check_loaded.
    if len(v) > MAX_PROMPT_CHARS:
        return f'is too long ({len(v)} characters, limit {MAX_PROMPT_CHARS})'
    from orin_llm_node.engine.structured import check_grammar, check_response_format
    try:
        fmt = json_value(v)
    except ValueError as exc:           # e.g. {type: json_object}: YAML's quotes went
        return f'{one_line(exc)}; {quoting_hint("response_format")}'
    if fmt is not None and not isinstance(fmt, dict):
        return f'must be a JSON object; {quoting_hint("response_format")}'
    try:
        fmt = check_response_format(fmt)
        if fmt is not None:
            check_grammar(fmt)
    except ValueError as exc:
        return one_line(exc)
    return None


def tools_problem(v):
    """Why ``tools`` text ``v`` cannot be offered (None: it can)."""
    # Shapes and each tool's schema compiled without a vocabulary, as response_format; the
    # loaded engine's own check (its tool tokens, the rendered tools): check_loaded.
    if len(v) > MAX_TOOLS_CHARS:
        return f'is too long ({len(v)} characters, limit {MAX_TOOLS_CHARS})'
    from orin_llm_node.engine.tool_calls import check_tool_schemas
    try:
        tools = json_value(v)
    except ValueError as exc:
        return f'{one_line(exc)}; {quoting_hint("tools")}'
    if tools is not None and not isinstance(tools, list):
        return (f'tools must be a list of function definitions (JSON), got '
                f'{type(tools).__name__}; {quoting_hint("tools")}')
    try:
        check_tool_schemas(tools)
    except ValueError as exc:
        return one_line(exc)
    return None
