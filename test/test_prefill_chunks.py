# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Chunked prefill on the tiny checkpoint (CPU, fp32): exact, and stoppable between chunks.

A prompt's uncached tokens run in chunks of ``EngineConfig.prefill_chunk_tokens``. Greedy
answers must equal transformers' on the whole prompt whatever the chunk size, with chunk
boundaries inside images, clips and blocks; ``SamplingParams.timeout_s`` (the node's
``max_generation_s``) and ``LLMEngine.cancel()`` must end a long prefill between chunks with
no token, keeping the chunks done for the next turn.

The deadline and cancel tests make the moment deterministic by acting from a wrapper around
the runner's real ``prefill`` (each chunk still runs in full): it sleeps past the deadline, or
calls ``cancel()`` from another thread, after a given chunk. One more test uses only the wall
clock, with a deadline a few chunks long, calibrated on this machine in the same test.
"""

import threading
import time

from _engine_reference import Reference, random_image
import pytest

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.processing import VideoClip

SYSTEM = 'You are a helpful assistant running on a robot. Answer briefly and precisely.'
LONG = ' '.join(f'Shelf {i} holds a red box and a blue crate.' for i in range(40))


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


def make_engine(ckpt, chunk, block_size=4, **kw):
    kw.setdefault('num_kv_blocks', 4096 // block_size)
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', block_size=block_size,
                                  block_order_seed=13 * block_size, prefill_chunk_tokens=chunk,
                                  **kw))


def assert_reference(ref, res, max_tokens):
    assert res.finish_reason in ('stop', 'length')
    want = ref.generate(res.prompt_token_ids, res.prompt_images, max_tokens,
                        videos=res.prompt_videos)
    assert res.token_ids == want


class ChunkSpy:
    """Counts the runner's prefill calls (chunks) and runs ``after(n)`` after the n-th."""

    def __init__(self, engine, after=None):
        self.calls, self.after = [], after
        self._prefill = engine.runner.prefill
        engine.runner.prefill = self

    def __call__(self, token_ids, positions, block_table, num_cached, visual=None):
        logits = self._prefill(token_ids, positions, block_table, num_cached, visual)
        self.calls.append((num_cached, len(token_ids), visual is not None))
        if self.after is not None:
            self.after(len(self.calls))
        return logits


@pytest.mark.parametrize('chunk', [5, 16, 61])
def test_chunked_prefill_matches_transformers(tiny_ckpt, ref, chunk):
    """Odd chunks, block-aligned chunks (16 = 4 blocks); boundaries inside the 64-token image."""
    eng = make_engine(tiny_ckpt, chunk)
    spy = ChunkSpy(eng)
    conv = eng.new_conversation(SYSTEM)
    r1 = eng.chat(conv, 'What is in front of you?', [random_image(5, 256, 256)],
                  SamplingParams(max_tokens=12))
    assert_reference(ref, r1, 12)
    ids = r1.prompt_token_ids
    assert [c[:2] for c in spy.calls] == [(lo, min(chunk, len(ids) - lo))
                                          for lo in range(0, len(ids), chunk)]
    pads = [i for i, t in enumerate(ids) if t == eng.model.config.image_token_id]
    with_image = [lo for lo, size, _ in spy.calls if any(lo <= i < lo + size for i in pads)]
    assert [lo for lo, _, has_visual in spy.calls if has_visual] == with_image
    assert len(with_image) >= 2, 'a chunk boundary must fall inside the image'
    # The next turn: a prefix-cache hit, then the rest of the prompt in chunks again.
    spy.calls.clear()
    r2 = eng.chat(conv, LONG, sampling=SamplingParams(max_tokens=12))
    assert r2.cached_tokens > 0 and len(spy.calls) > 1
    assert spy.calls[0][0] == r2.cached_tokens
    assert_reference(ref, r2, 12)


def test_chunk_boundaries_inside_a_clip_and_an_image(tiny_ckpt, ref):
    frames = [random_image(20 + i, 50, 70) for i in range(8)]
    clip = VideoClip(frames, [i / 2.0 for i in range(8)])
    eng = make_engine(tiny_ckpt, 7)
    res = eng.chat(eng.new_conversation(SYSTEM), 'What moved?',
                   images=[random_image(9, 96, 128)], videos=[clip],
                   sampling=SamplingParams(max_tokens=10, ignore_eos=True))
    assert res.prompt_videos and res.prompt_images
    assert_reference(ref, res, 10)


def test_deadline_ends_a_long_prefill_between_chunks(tiny_ckpt, ref):
    """The deadline passes while chunk 3 of ~35 runs: the turn ends after it, no token."""
    eng = make_engine(tiny_ckpt, 16)
    timeout = 2.0
    spy = ChunkSpy(eng, after=lambda n: time.sleep(timeout + 0.1) if n == 3 else None)
    conv = eng.new_conversation(SYSTEM)
    res = eng.chat(conv, LONG, sampling=SamplingParams(max_tokens=8, timeout_s=timeout))
    assert res.finish_reason == 'timeout'
    assert res.token_ids == [] and res.text == ''
    assert len(spy.calls) == 3 < len(res.prompt_token_ids) / 16
    assert conv.num_kv_tokens == 48  # the three chunks' K/V stay
    # The conversation goes on: the interrupted turn is history, its chunks a cache hit.
    spy.after = None
    r2 = eng.chat(conv, 'Which shelf holds the blue crate?',
                  sampling=SamplingParams(max_tokens=10))
    assert r2.cached_tokens >= 48
    assert_reference(ref, r2, 10)


def test_cancel_from_another_thread_ends_a_long_prefill(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 16)

    def cancel_after(n):
        if n == 2:
            t = threading.Thread(target=eng.cancel)
            t.start()
            t.join()

    spy = ChunkSpy(eng, after=cancel_after)
    conv = eng.new_conversation(SYSTEM)
    res = eng.chat(conv, LONG, sampling=SamplingParams(max_tokens=8, ignore_eos=True))
    assert res.finish_reason == 'cancelled' and res.token_ids == []
    assert len(spy.calls) == 2 and conv.num_kv_tokens == 32
    r2 = eng.chat(conv, 'Go on.', sampling=SamplingParams(max_tokens=6))
    assert r2.finish_reason in ('stop', 'length')
    assert_reference(ref, r2, 6)


def test_deadline_passed_before_the_prefill_runs_nothing(tiny_ckpt):
    eng = make_engine(tiny_ckpt, 16)
    spy = ChunkSpy(eng)
    conv = eng.new_conversation(SYSTEM)
    res = eng.chat(conv, LONG, [random_image(4, 96, 96)],
                   SamplingParams(max_tokens=8, timeout_s=1e-9))
    assert res.finish_reason == 'timeout' and res.token_ids == [] and spy.calls == []
    assert conv.num_kv_tokens == 0


def test_deadline_on_the_wall_clock_cuts_a_long_prefill(tiny_ckpt):
    """No wrapper: a ~1,000-token prompt in 32-token chunks, the deadline three short turns.

    A short turn (one chunk, one token; timed here first, warm) costs more than a chunk at the
    start of a context; the long prompt's chunks grow dearer as its context grows. The answer
    ends with "timeout", no token, and the prefill cut short.
    """
    eng = make_engine(tiny_ckpt, 32, enable_prefix_cache=False)
    prompt = LONG + ' ' + LONG
    for _ in range(2):  # the second run is warm
        t0 = time.perf_counter()
        eng.chat(eng.new_conversation(), 'Hello robot, is the path clear?',
                 sampling=SamplingParams(max_tokens=1))
        chunk_s = time.perf_counter() - t0
    conv = eng.new_conversation()
    t0 = time.perf_counter()
    res = eng.chat(conv, prompt, sampling=SamplingParams(max_tokens=8, timeout_s=3 * chunk_s))
    elapsed = time.perf_counter() - t0
    prompt_tokens = len(res.prompt_token_ids)
    assert prompt_tokens > 900
    assert res.finish_reason == 'timeout' and res.token_ids == []
    assert conv.num_kv_tokens < prompt_tokens, (conv.num_kv_tokens, chunk_s, elapsed)
