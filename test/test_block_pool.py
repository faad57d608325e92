# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Engine parts that need no model: pool, hashes, ladder levels, configs, sampler, detokenizer.

Also the vision-output cache bound.
"""

import random

import pytest
import torch

from orin_llm_node.engine import BlockPool, EngineConfig, SamplingParams
from orin_llm_node.engine.block_hash import block_hash, extra_keys
from orin_llm_node.engine.detokenizer import IncrementalDetokenizer
from orin_llm_node.engine.kv_manager import drop_levels
from orin_llm_node.engine.sampler import Sampler
from orin_llm_node.engine.vision_cache import VisionCache
from orin_llm_node.models import VisionOutput
from orin_llm_node.processing import Tokenizer


def counts(pool):
    free, cached, used = pool.num_free, pool.num_cached, pool.num_used
    assert free + cached + used == pool.num_blocks
    return free, cached, used


def test_allocate_release_counts_and_exhaustion():
    pool = BlockPool(4, 16)
    blocks = [pool.allocate() for _ in range(4)]
    assert sorted(blocks) == [0, 1, 2, 3]
    assert pool.allocate() is None  # exhausted: no exception, the caller walks the ladder
    assert counts(pool) == (0, 0, 4)
    pool.release(blocks)
    assert counts(pool) == (4, 0, 0)
    with pytest.raises(ValueError):
        pool.release([blocks[0]])


def test_initial_order_is_permuted_by_seed():
    a = [BlockPool(64, 4, order_seed=7).allocate() for _ in range(1)]
    pool = BlockPool(64, 4, order_seed=7)
    order = [pool.allocate() for _ in range(64)]
    assert order != list(range(64)) and sorted(order) == list(range(64))
    assert order[0] == a[0]
    pool2 = BlockPool(64, 4, order_seed=8)
    assert [pool2.allocate() for _ in range(64)] != order


def test_cached_blocks_are_lru_and_plain_free_blocks_go_first():
    pool = BlockPool(6, 4)
    seq = [pool.allocate() for _ in range(3)]
    hashes = [bytes([i]) * 16 for i in range(3)]
    for b, h in zip(seq, hashes, strict=True):
        assert pool.register(b, h)
    plain = pool.allocate()
    pool.release(seq)  # tail first: the prefix is the most recently released
    pool.release([plain])
    assert counts(pool) == (3, 3, 0)
    assert pool.lookup(hashes[0]) == seq[0]
    # Plain free blocks are handed out before any cached block is evicted.
    firsts = [pool.allocate() for _ in range(3)]
    assert set(firsts).isdisjoint(seq) and pool.evictions == 0
    # Then the cached blocks go, the tail of the released sequence first.
    assert pool.allocate() == seq[2] and pool.evictions == 1
    assert pool.lookup(hashes[2]) is None and pool.lookup(hashes[0]) == seq[0]
    assert counts(pool) == (0, 2, 4)


def test_acquire_revives_cached_block_and_shares_used_ones():
    pool = BlockPool(3, 4)
    b = pool.allocate()
    pool.register(b, b'h' * 16)
    pool.acquire(b)  # a second conversation shares it
    assert pool.ref_count(b) == 2
    pool.release([b])
    pool.release([b])
    assert counts(pool) == (2, 1, 0)
    pool.acquire(b)  # prefix hit on a cached block
    assert counts(pool) == (2, 0, 1)
    never_used = min({0, 1, 2} - {b})
    with pytest.raises(ValueError):
        pool.acquire(never_used)  # a plain free block holds nothing to hit


@pytest.mark.parametrize('num_blocks, block_size', [(0, 16), (-1, 16), (4, 0), (4, -4)])
def test_a_pool_without_blocks_or_tokens_is_refused(num_blocks, block_size):
    with pytest.raises(ValueError, match='positive'):
        BlockPool(num_blocks, block_size)


def test_register_needs_a_referenced_block():
    pool = BlockPool(3, 4)
    never = pool.allocate()
    pool.release([never])  # free again, no hash: unreferenced
    with pytest.raises(ValueError, match='not referenced'):
        pool.register(never, b'a' * 16)
    cached = pool.allocate()
    assert pool.register(cached, b'b' * 16)
    pool.release([cached])  # unreferenced, hash kept: cached
    with pytest.raises(ValueError, match='not referenced'):
        pool.register(cached, b'c' * 16)
    # Nothing changed: the plain block holds no hash, the cached one keeps its own.
    assert pool.lookup(b'a' * 16) is None and pool.lookup(b'c' * 16) is None
    assert pool.lookup(b'b' * 16) == cached and counts(pool) == (2, 1, 0)


def test_register_again_keeps_the_first_hash_of_a_block():
    pool = BlockPool(2, 4)
    b = pool.allocate()
    assert pool.register(b, b'x' * 16)
    assert pool.register(b, b'x' * 16)  # the same hash again: still its own
    assert not pool.register(b, b'y' * 16)  # another hash: refused, the first one kept
    assert pool.lookup(b'x' * 16) == b and pool.lookup(b'y' * 16) is None


def test_duplicate_hash_keeps_first_block():
    pool = BlockPool(2, 4)
    a, b = pool.allocate(), pool.allocate()
    assert pool.register(a, b'x' * 16)
    assert not pool.register(b, b'x' * 16)
    pool.release([a, b])
    assert counts(pool) == (1, 1, 0)
    assert pool.lookup(b'x' * 16) == a


def test_clear_cache_forgets_hashes():
    pool = BlockPool(2, 4)
    a = pool.allocate()
    pool.register(a, b'y' * 16)
    pool.release([a])
    pool.clear_cache()
    assert counts(pool) == (2, 0, 0) and pool.lookup(b'y' * 16) is None


def test_random_operations_keep_invariants():
    rng = random.Random(0)
    pool = BlockPool(32, 4, order_seed=3)
    held: list[list[int]] = []
    for step in range(2000):
        op = rng.random()
        if op < 0.5:
            seq = []
            for _ in range(rng.randint(1, 5)):
                b = pool.allocate()
                if b is None:
                    break
                seq.append(b)
                if rng.random() < 0.6:
                    pool.register(b, rng.randbytes(16) if rng.random() < 0.5 else
                                  bytes([rng.randrange(8)]) * 16)
            held.append(seq)
        elif op < 0.8 and held:
            pool.release(held.pop(rng.randrange(len(held))))
        else:
            h = bytes([rng.randrange(8)]) * 16
            b = pool.lookup(h)
            if b is not None:
                pool.acquire(b)
                held.append([b])
        free, cached, used = counts(pool)
        assert used == len({b for seq in held for b in seq}), step
    for seq in held:
        pool.release(seq)
    assert counts(pool)[2] == 0


def test_block_hash_chains_and_names_images():
    toks = [1, 2, 3, 4]
    h0 = block_hash(None, toks)
    assert block_hash(None, toks) == h0
    assert block_hash(h0, toks) != h0  # the parent is part of the key
    img_a, img_b = b'a' * 16, b'b' * 16
    # Same placeholder ids, different image -> different block.
    assert block_hash(None, toks, ((img_a, 0),)) != block_hash(None, toks, ((img_b, 0),))
    # Same image at another offset inside the block -> different block.
    assert block_hash(None, toks, ((img_a, 0),)) != block_hash(None, toks, ((img_a, -4),))


def test_extra_keys_name_every_overlapping_image():
    class Img:
        def __init__(self, key, n):
            self.key, self.num_tokens = key, n

    a, b = Img(b'a', 6), Img(b'b', 3)
    spans = [(2, a), (9, b)]
    assert extra_keys(spans, 0, 4) == ((b'a', 2),)
    assert extra_keys(spans, 4, 8) == ((b'a', -2),)
    assert extra_keys(spans, 8, 12) == ((b'b', 1),)
    assert extra_keys(spans, 12, 16) == ()


def test_drop_levels_are_large_chunks():
    assert drop_levels(0) == [0]
    assert drop_levels(1) == [0, 1]
    assert drop_levels(4) == [0, 2, 3, 4]
    assert drop_levels(9) == [0, 5, 7, 8, 9]


@pytest.mark.parametrize('kwargs, word', [
    ({'block_size': 0}, 'block_size'),
    ({'num_kv_blocks': -3}, 'num_kv_blocks'),
    ({'device': 'tpu'}, 'device'),
    ({'dtype': 'int8'}, 'dtype'),
    ({'kv_cache_memory_mb': 0}, 'kv_cache_memory_mb'),
    ({'gpu_memory_fraction': 1.5}, 'gpu_memory_fraction'),
    ({'max_model_len': 0}, 'max_model_len'),
    ({'image_min_pixels': 5000, 'image_max_pixels': 4000}, 'image_min_pixels'),
    ({'vision_cache_mb': -1}, 'vision_cache_mb'),
])
def test_engine_config_errors_name_the_field(kwargs, word):
    with pytest.raises(ValueError, match=word):
        EngineConfig(model_path='/x', **kwargs)


def test_engine_config_auto_resolution():
    cfg = EngineConfig(model_path='/x', device='cpu')
    dev = cfg.resolve_device()
    assert dev.type == 'cpu' and cfg.resolve_dtype(dev) == torch.float32
    assert EngineConfig(model_path='/x', dtype='bf16').resolve_dtype(dev) == torch.bfloat16


@pytest.mark.parametrize('kwargs, word', [
    ({'max_tokens': 0}, 'max_tokens'),
    ({'temperature': -0.1}, 'temperature'),
    ({'top_p': 0.0}, 'top_p'),
    ({'top_k': -1}, 'top_k'),
    ({'seed': 1.5}, 'seed'),
    ({'timeout_s': 0}, 'timeout_s'),
])
def test_sampling_params_errors(kwargs, word):
    with pytest.raises(ValueError, match=word):
        SamplingParams(**kwargs)


def test_sampler_greedy_filters_and_seed():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0, 0.5])
    assert Sampler(SamplingParams(), torch.device('cpu'))(logits) == 1
    assert Sampler(SamplingParams(), torch.device('cpu'), banned_ids=[1])(logits) == 2
    # top_k=1 and a tiny top_p both reduce sampling to the argmax.
    assert {Sampler(SamplingParams(temperature=1.0, top_k=1, seed=s), torch.device('cpu'))(
        logits) for s in range(20)} == {1}
    assert {Sampler(SamplingParams(temperature=1.0, top_p=0.01, seed=s), torch.device('cpu'))(
        logits) for s in range(20)} == {1}
    # top_k=2 never leaves the two best tokens; a seed reproduces the draw.
    params = SamplingParams(temperature=2.0, top_k=2, seed=5)
    draws = [Sampler(params, torch.device('cpu'))(logits) for _ in range(5)]
    assert len(set(draws)) == 1 and draws[0] in (1, 2)
    s = Sampler(SamplingParams(temperature=5.0, top_k=2, seed=1), torch.device('cpu'))
    assert {s(logits) for _ in range(200)} == {1, 2}
    s = Sampler(SamplingParams(temperature=5.0, seed=1), torch.device('cpu'))
    assert len({s(logits) for _ in range(200)}) == 5


def test_detokenizer_never_emits_broken_utf8(tiny_ckpt):
    tok = Tokenizer.from_pretrained(tiny_ckpt)
    text = 'Grüße 日本語 emoji 🤖📷✅ ñandú, a robot!'
    ids = tok.encode(text)
    assert len(ids) > len(text) / 2  # the tiny vocabulary splits characters into bytes
    detok = IncrementalDetokenizer(tok.decode)
    deltas = [detok.add(i) for i in ids]
    deltas.append(detok.flush())
    assert ''.join(deltas) == text == detok.text
    assert not any('\ufffd' in d for d in deltas)
    assert any(d == '' for d in deltas)  # held back inside a multi-byte character


def test_vision_cache_is_bounded_lru():
    def out(n):
        return VisionOutput(torch.zeros(n, 4), (torch.zeros(n, 4),))  # 32 bytes per row

    cache = VisionCache(max_bytes=32 * 10)
    cache.put('a', out(4))
    cache.put('b', out(4))
    assert cache.get('a') is not None  # a is now the most recent
    cache.put('c', out(4))  # evicts b
    assert cache.get('b') is None and cache.get('c') is not None and cache.get('a') is not None
    cache.put('big', out(11))  # larger than the bound: not stored
    assert cache.get('big') is None and cache.bytes <= cache.max_bytes
    assert (cache.hits, cache.misses) == (3, 2)
