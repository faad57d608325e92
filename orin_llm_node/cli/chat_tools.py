# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_chat --tools`` / ``--tool-results`` / ``--detect``: tool calls and boxes.

    orin_llm_chat --tools tools.json "Point at the red circle."
    orin_llm_chat --tools tools.json --tool-results results.json "Point at the red circle."
    orin_llm_chat --detect "red cup,gripper"

``--tools FILE`` (a JSON list of OpenAI function definitions) sends the question on
``prompt/json`` with those tools and prints the answer's calls, one JSON object per line
(``{"id", "name", "arguments"}``), or its text when it calls none. ``--tool-results FILE`` (a
JSON object: tool name -> result, text or any JSON value) answers each call with its tool's
result in the next turn (the same tools, no new message) and prints that answer the same way.
``--detect LABELS`` (comma-separated) asks every camera of the node for the boxes of those
labels and prints one detection per line (``{label, bbox, camera, frame_id, stamp}``: the box
in that camera frame's pixels). The files are read, bounded, before anything is sent.
"""

import json
from pathlib import Path
import sys

from orin_llm_node import bounded_json
from orin_llm_node.parameters import MAX_TOOLS_CHARS


def add_arguments(parser):
    """The options of this module on ``orin_llm_chat``'s parser."""
    parser.add_argument('--tools', metavar='FILE',
                        help='JSON list of tools (OpenAI function definitions) the model may '
                             'call; the calls are printed as JSON lines')
    parser.add_argument('--tool-choice', default=None,
                        help='auto (default), required, none or a tool name (with --tools)')
    parser.add_argument('--tool-results', metavar='FILE',
                        help="JSON object: tool name -> result; each call gets its tool's "
                             'result back in the next turn (with --tools)')
    parser.add_argument('--detect', metavar='LABELS',
                        help="comma-separated labels: print their boxes in each camera's "
                             'pixels as JSON lines')


def read(opts):
    """Check the options and read their files into ``opts``; ``ValueError`` says what is wrong.

    ``opts.tools`` (list or None), ``opts.tool_results`` (dict or None), ``opts.detect``
    (labels or None); also whether they go together.
    """
    if opts.detect is not None:
        labels = [label.strip() for label in opts.detect.split(',') if label.strip()]
        if not labels:
            raise ValueError('--detect needs at least one label')
        if opts.tools or opts.response_format is not None or opts.video:
            raise ValueError('--detect excludes --tools, --schema, --json and --video')
        opts.detect = labels
    if opts.tools is None:
        if opts.tool_choice is not None or opts.tool_results is not None:
            raise ValueError('--tool-choice and --tool-results need --tools')
    else:
        if opts.response_format is not None or opts.video:
            raise ValueError('--tools excludes --schema, --json and --video')
        opts.tools = json_file(opts.tools, list, 'a JSON list of tools', MAX_TOOLS_CHARS)
        if opts.tool_results is not None:
            opts.tool_results = json_file(opts.tool_results, dict,
                                          'a JSON object: tool name -> result', MAX_TOOLS_CHARS)
    if not opts.prompt and opts.detect is None:
        raise ValueError('the question is required (only --detect may go without one)')


def json_file(path, kind, what, limit):
    """The JSON value of file ``path``: a ``kind`` (``what`` names it) of ``limit`` characters.

    ``ValueError`` in one line otherwise (too long, not JSON, nested deeper than the node
    takes, another kind): the node would refuse the request it goes into.
    """
    text = Path(path).read_text()
    if len(text) > limit:
        raise ValueError(f'{path}: {len(text)} characters; the node takes at most {limit}')
    try:
        value = bounded_json.loads(text)
    except ValueError as exc:           # not JSON, nested too deep
        raise ValueError(f'{path}: {" ".join(str(exc).split())}') from None
    if not isinstance(value, kind):
        raise ValueError(f'{path}: must be {what}')
    return value


def _tool_choice(choice):
    if choice is None or choice in ('auto', 'required', 'none'):
        return choice
    return {'name': choice}


def converse(client, opts, answered):
    """Ask, print, and answer the calls once (``answered(info)``: chat.py's verdict).

    Returns ``(exit code or None, the first answer's response/info)``: the answer that took
    the image; None: go on to the image verdict.
    """
    if opts.detect is not None:
        envelope = {'detect': opts.detect}
        if opts.prompt:
            envelope['prompt'] = ' '.join(opts.prompt)
        info = client.ask_envelope(envelope, opts.timeout)
        if not answered(info):
            return 1, info
        for det in info.get('detections') or []:
            print(json.dumps(det, ensure_ascii=False))
        _said(info, f"{len(info.get('detections') or [])} detection(s)")
        return None, info
    envelope = {'prompt': ' '.join(opts.prompt), 'tools': opts.tools}
    if opts.tool_choice is not None:
        envelope['tool_choice'] = _tool_choice(opts.tool_choice)
    info = client.ask_envelope(envelope, opts.timeout)
    if not answered(info):
        return 1, info
    _print_answer(info)
    calls = info.get('tool_calls') or []
    if opts.tool_results is None or not calls:
        return None, info
    missing = sorted({c['name'] for c in calls} - set(opts.tool_results))
    if missing:
        print(f'orin_llm_chat: the --tool-results file has no result for '
              f'{", ".join(missing)}', file=sys.stderr)
        return 1, info
    results = [{'id': c['id'], 'name': c['name'], 'content': _content(opts.tool_results[
        c['name']])} for c in calls]
    first, info = info, client.ask_envelope({'tools': opts.tools, 'tool_results': results},
                                            opts.timeout)
    if not answered(info):
        return 1, first
    _print_answer(info)
    return None, first


def _content(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _print_answer(info):
    calls = info.get('tool_calls') or []
    for call in calls:
        print(json.dumps(call, ensure_ascii=False), flush=True)
    if not calls:
        print(info['text'], flush=True)
    _said(info, f'{len(calls)} tool call(s)')


def _said(info, what):
    print(f"[request {info['request_id']}: finish_reason={info['finish_reason']}, {what}, "
          f"{info.get('generated_tokens')} tokens]", file=sys.stderr)
