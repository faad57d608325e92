# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Structured-generation libraries compared at Qwen3-VL's vocabulary size (151,936 logits).

No real tokenizer can be downloaded here, so a byte-level BPE of 151,643 regular tokens (plus
the Qwen special tokens) is trained locally with ``tokenizers`` on a generated corpus, the way
``orin_llm_node.testing`` builds the tiny checkpoints' tokenizer (about a minute; cached under
``--out``). For every library that imports (xgrammar, llguidance, outlines-core; none is
required) and every grammar (the README's robot schema, a nested schema with arrays, any JSON
object, a regex) it measures:

* ``tokenizer_s``: building the library's tokenizer index (once per model);
* ``compile_s``: compiling the grammar (cold, no cache);
* ``mask_ms_mean`` / ``mask_ms_p99``: filling the next-token bitmask, per token, while walking
  a valid answer tokenized by the tokenizer (the host work constrained decoding adds per step);
* ``accept_ms_mean``: advancing the matcher by the sampled token.

Run (the libraries need not be in the venv; e.g. ``pip install --target /tmp/sg xgrammar``)::

    PYTHONPATH=$PWD:/tmp/sg .venv/bin/python bench/structured_libraries.py

Prints JSON and writes ``structured_libraries.json`` to ``--out`` (default bench/results).
"""

import argparse
import json
from pathlib import Path
import random
import statistics
import time

import numpy as np

from orin_llm_node.testing.tiny_checkpoint import train_tokenizer

VOCAB = 151936  # the logits' width (Qwen3-VL pads the tokenizer's 151,669 ids to this)
REGULAR_TOKENS = 151643

ROBOT_SCHEMA = {
    'type': 'object',
    'properties': {
        'colour': {'type': 'string', 'enum': ['red', 'green', 'blue', 'yellow']},
        'shape': {'type': 'string', 'enum': ['cube', 'sphere', 'cylinder']},
        'count': {'type': 'integer', 'minimum': 0},
    },
    'required': ['colour', 'shape', 'count'],
    'additionalProperties': False,
}
NESTED_SCHEMA = {
    'type': 'object',
    'properties': {
        'objects': {'type': 'array', 'items': {
            'type': 'object',
            'properties': {
                'name': {'type': 'string'},
                'colour': {'type': 'string', 'enum': ['red', 'green', 'blue', 'yellow']},
                'position': {'type': 'object', 'properties': {
                    'x': {'type': 'number'}, 'y': {'type': 'number'}, 'z': {'type': 'number'}},
                    'required': ['x', 'y', 'z'], 'additionalProperties': False},
                'graspable': {'type': 'boolean'},
            },
            'required': ['name', 'colour', 'position', 'graspable'],
            'additionalProperties': False,
        }},
        'action': {'type': 'string', 'enum': ['pick', 'place', 'wait']},
    },
    'required': ['objects', 'action'],
    'additionalProperties': False,
}
NESTED_ANSWER = {
    'objects': [
        {'name': f'part number {i} on the left shelf', 'colour': ['red', 'blue'][i % 2],
         'position': {'x': 0.25 * i, 'y': -1.5 + i, 'z': 0.125}, 'graspable': i % 2 == 0}
        for i in range(5)
    ],
    'action': 'pick',
}
REGEX = r'(left|right|ahead), [0-9]{1,3} cm, (grasp|push|skip)'
GRAMMARS = {
    # name: (response_format, a valid answer)
    'robot_schema': ({'type': 'json_schema', 'schema': ROBOT_SCHEMA},
                     json.dumps({'colour': 'blue', 'shape': 'cylinder', 'count': 3})),
    'nested_schema': ({'type': 'json_schema', 'schema': NESTED_SCHEMA},
                      json.dumps(NESTED_ANSWER)),
    'json_object': ({'type': 'json_object'}, json.dumps(NESTED_ANSWER)),
    'regex': ({'type': 'regex', 'pattern': REGEX}, 'right, 125 cm, grasp'),
}


def big_tokenizer(out: Path):
    """A byte-level BPE of 151,643 regular tokens + the Qwen specials (cached under ``out``)."""
    path = out / 'bpe151643' / 'tokenizer.json'
    if not path.is_file():
        rng = random.Random(0)
        letters = 'abcdefghijklmnopqrstuvwxyz'
        words = set()
        while len(words) < 300_000:
            word = ''.join(rng.choice(letters) for _ in range(rng.randint(2, 12)))
            words.add(word.capitalize() if rng.random() < 0.3 else word)
        words = sorted(words)
        corpus = [' '.join(words[i:i + 20]) + f'. {{"{words[i]}": {rng.randint(0, 99999)}}}\n'
                  for i in range(0, len(words), 20)]
        path.parent.mkdir(parents=True, exist_ok=True)
        train_tokenizer(corpus, vocab_size=REGULAR_TOKENS).save(str(path))
    from tokenizers import Tokenizer

    return path, Tokenizer.from_file(str(path))


def _byte_decoder() -> dict[str, int]:
    # GPT-2's byte-level alphabet: printable bytes map to themselves, the rest to 256 + n.
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def token_bytes(tok) -> list[bytes]:
    """Each id's bytes (special tokens as their text), in id order."""
    dec = _byte_decoder()
    vocab = tok.get_vocab()
    special = {t.content for t in tok.get_added_tokens_decoder().values()}
    out = [b''] * len(vocab)
    for text, i in vocab.items():
        out[i] = text.encode() if text in special else bytes(dec[c] for c in text)
    return out


class _XGrammar:
    name = 'xgrammar'

    def __init__(self, tok_path, tok, stop_ids):
        import torch
        import xgrammar as xgr

        self.xgr, self.torch = xgr, torch
        encoded = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
        info = xgr.TokenizerInfo(encoded, xgr.VocabType.BYTE_LEVEL, vocab_size=VOCAB,
                                 stop_token_ids=stop_ids)
        self.compiler = xgr.GrammarCompiler(info, cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, VOCAB)

    def compile(self, fmt):
        c = self.compiler
        if fmt['type'] == 'json_schema':
            return c.compile_json_schema(json.dumps(fmt['schema']))
        if fmt['type'] == 'json_object':
            return c.compile_builtin_json_grammar()
        return c.compile_regex(fmt['pattern'])

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m):
        m.fill_next_token_bitmask(self.bitmask)

    def accept(self, m, token):
        return m.accept_token(token)


class _LLGuidance:
    name = 'llguidance'

    def __init__(self, tok_path, tok, stop_ids):
        import llguidance
        import llguidance.numpy

        self.ll, self.np = llguidance, llguidance.numpy
        self.tokenizer = llguidance.LLTokenizer(str(tok_path), n_vocab=VOCAB, eos_token=stop_ids)
        self.bitmask = llguidance.numpy.allocate_token_bitmask(1, VOCAB)

    def compile(self, fmt):
        m = self.ll.LLMatcher
        if fmt['type'] == 'json_schema':
            grammar = m.grammar_from_json_schema(fmt['schema'])
        elif fmt['type'] == 'json_object':
            grammar = m.grammar_from_json_schema({'type': 'object'})
        else:
            grammar = m.grammar_from_regex(fmt['pattern'])
        matcher = m(self.tokenizer, grammar)  # llguidance compiles when a matcher is made
        assert not matcher.is_error(), matcher.get_error()
        return grammar

    def matcher(self, grammar):
        return self.ll.LLMatcher(self.tokenizer, grammar)

    def fill(self, m):
        self.np.fill_next_token_bitmask(m, self.bitmask)

    def accept(self, m, token):
        return m.consume_token(token)


class _OutlinesCore:
    name = 'outlines-core'

    def __init__(self, tok_path, tok, stop_ids):
        import outlines_core

        self.oc = outlines_core
        mapping: dict[bytes, list[int]] = {}
        special = {t.content for t in tok.get_added_tokens_decoder().values()}
        for i, b in enumerate(token_bytes(tok)):
            if b.decode(errors='replace') not in special:
                mapping.setdefault(b, []).append(i)
        self.eos = stop_ids[0]
        self.vocab = outlines_core.Vocabulary(self.eos, mapping)
        self.bitmask = np.zeros((VOCAB + 31) // 32, dtype=np.int32)

    def compile(self, fmt):
        from outlines_core.json_schema import build_regex_from_schema

        if fmt['type'] == 'json_schema':
            regex = build_regex_from_schema(json.dumps(fmt['schema']))
        elif fmt['type'] == 'json_object':
            # Regex-only: an object of any depth is not a regular language; depth 2 here.
            regex = build_regex_from_schema(json.dumps({'type': 'object'}))
        else:
            regex = fmt['pattern']
        return self.oc.Index(regex, self.vocab)

    def matcher(self, index):
        return self.oc.Guide(index)

    def fill(self, g):
        b = self.bitmask
        g.write_mask_into(b.ctypes.data, b.size, b.itemsize)

    def accept(self, g, token):
        if token == self.eos:  # outlines' end: a final state, not a stop token to advance by
            return g.is_finished()
        g.advance(token)
        return True


LIBRARIES = (_XGrammar, _LLGuidance, _OutlinesCore)


def measure(lib_cls, tok_path, tok, stop_ids):
    try:
        t0 = time.perf_counter()
        lib = lib_cls(tok_path, tok, stop_ids)
        tokenizer_s = time.perf_counter() - t0
    except ImportError as exc:
        return {'error': f'not importable: {exc}'}
    out = {'tokenizer_s': round(tokenizer_s, 3), 'grammars': {}}
    for name, (fmt, answer) in GRAMMARS.items():
        try:
            t0 = time.perf_counter()
            compiled = lib.compile(fmt)
            compile_s = time.perf_counter() - t0
        except Exception as exc:  # a library that cannot express the grammar
            out['grammars'][name] = {'error': f'{type(exc).__name__}: {exc}'[:300]}
            continue
        ids = tok.encode(answer).ids
        fills, accepts, starts = [], [], []
        try:
            for _ in range(3):  # three walks, the first one warms caches
                t0 = time.perf_counter()
                m = lib.matcher(compiled)
                lib.fill(m)
                starts.append(time.perf_counter() - t0)
                for token in [*ids, stop_ids[0]]:
                    t0 = time.perf_counter()
                    lib.fill(m)
                    t1 = time.perf_counter()
                    ok = lib.accept(m, token)
                    t2 = time.perf_counter()
                    fills.append(t1 - t0)
                    accepts.append(t2 - t1)
                    if not ok:
                        raise ValueError(f'token {token} refused')
        except Exception as exc:  # the answer (or its stop token) refused
            out['grammars'][name] = {'compile_s': round(compile_s, 4),
                                     'error': f'{type(exc).__name__}: {exc}'[:300]}
            continue
        fills = fills[len(fills) // 3:]
        accepts = accepts[len(accepts) // 3:]
        out['grammars'][name] = {
            'compile_s': round(compile_s, 4),
            # a new request: its matcher and first mask (the first walk's, caches cold)
            'first_mask_ms': round(starts[0] * 1e3, 3),
            'tokens': len(ids) + 1,
            'mask_ms_mean': round(statistics.fmean(fills) * 1e3, 4),
            'mask_ms_p99': round(float(np.percentile(fills, 99)) * 1e3, 4),
            'accept_ms_mean': round(statistics.fmean(accepts) * 1e3, 4),
        }
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--out', type=Path, default=Path(__file__).resolve().parent / 'results')
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tok_path, tok = big_tokenizer(args.out)
    stop_ids = [tok.token_to_id('<|im_end|>'), tok.token_to_id('<|endoftext|>')]
    result = {'vocab_size': VOCAB, 'tokenizer_tokens': tok.get_vocab_size(), 'libraries': {}}
    for lib_cls in LIBRARIES:
        result['libraries'][lib_cls.name] = measure(lib_cls, tok_path, tok, stop_ids)
    text = json.dumps(result, indent=2)
    print(text)
    (args.out / 'structured_libraries.json').write_text(text + '\n')


if __name__ == '__main__':
    main()
