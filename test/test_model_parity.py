# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Our Qwen3-VL modules against transformers' reference, fp32 on CPU, on tiny checkpoints.

Inputs are built the reference way (the checkpoint's tokenizer and chat template, and
``Qwen2VLImageProcessorPil``); our positions come from ``processing.rope_index``. The mutation
tests break one detail at a time and check that the same comparisons then fail.
"""


from _model_reference import (
    assert_logits_parity,
    assert_vision_parity,
    build_prompt,
    our_logits,
    reference,
    reference_logits,
)
from contiguous_attention import ContiguousAttention
import pytest
import torch

from orin_llm_node.attention.base import causal_attention
from orin_llm_node.layers import rotary_embedding
from orin_llm_node.models import load_model, qwen3_vl_text, qwen3_vl_vision
from orin_llm_node.processing.rope_index import rope_positions

transformers = pytest.importorskip('transformers')
PIL_Image = pytest.importorskip('PIL.Image')


# Shapes of the tiny checkpoints under test (the defaults come from the `tiny_ckpt` fixture).
VARIANTS = {
    'untied': dict(tie_word_embeddings=False),
    'deepstack3': dict(vision_config={'depth': 4, 'deepstack_visual_indexes': [1, 2, 3]}),
    'head_dim64': dict(text_config={
        'head_dim': 64,
        'rope_parameters': {'rope_type': 'default', 'rope_theta': 10000.0,
                            'mrope_section': [12, 10, 10], 'mrope_interleaved': True}}),
    'layers6': dict(text_config={'num_hidden_layers': 6}),
}


@pytest.fixture
def variant_ckpt(request, make_ckpt, tiny_ckpt):
    name = request.param
    return tiny_ckpt if name == 'default' else make_ckpt(f'models-{name}', **VARIANTS[name])




TWO_IMAGES = [([(96, 160), (224, 128)], 'How many shapes are there?', None)]


# ---------------------------------------------------------------- parity on the default shape

def test_text_only(tiny_ckpt):
    p = build_prompt(tiny_ckpt, [([], 'Is the path clear? Answer briefly.', None)])
    assert_logits_parity(load_model(tiny_ckpt), tiny_ckpt, p)


@pytest.mark.parametrize('size', [(64, 64), (96, 160), (224, 128)])
def test_one_image(tiny_ckpt, size):
    model = load_model(tiny_ckpt)
    p = build_prompt(tiny_ckpt, [([size], 'What is in front of you?', None)])
    assert_vision_parity(model, tiny_ckpt, p)
    assert_logits_parity(model, tiny_ckpt, p)


def test_two_turns_incremental(tiny_ckpt):
    """Image in each turn; we prefill turn 2 on top of turn 1's KV (bottom-right mask)."""
    model = load_model(tiny_ckpt)
    p = build_prompt(tiny_ckpt, [
        ([(64, 96)], 'What colour is the shape?', 'It is red.'),
        ([(128, 64)], 'And what shape is it?', None),
    ])
    assert len(p.turn_starts) == 2
    assert_logits_parity(model, tiny_ckpt, p, chunks=[p.turn_starts[1]])


def test_greedy_64_tokens(tiny_ckpt):
    model, ref = load_model(tiny_ckpt), reference(tiny_ckpt)
    cfg = model.config
    p = build_prompt(tiny_ckpt, [([(96, 160)], 'Describe the image.', None)])
    n = len(p.ids)
    # min_new_tokens masks the eos logits in the reference; we mask the same ids.
    eos = ref.generation_config.eos_token_id
    eos = torch.tensor(eos if isinstance(eos, list) else [eos])

    def pick(logits):
        return int(logits[0].index_fill(0, eos, -torch.inf).argmax())

    with torch.no_grad():
        want = ref.generate(
            input_ids=p.ids[None], attention_mask=torch.ones(1, n, dtype=torch.long),
            pixel_values=p.pixel_values, image_grid_thw=p.grids,
            mm_token_type_ids=(p.ids == cfg.image_token_id).int()[None],
            max_new_tokens=64, min_new_tokens=64, do_sample=False)[0, n:].tolist()
        attn = ContiguousAttention(cfg.text.num_hidden_layers)
        pos, next_start = rope_positions(p.ids.tolist(), p.grids.tolist(), cfg.image_token_id,
                                         cfg.vision.spatial_merge_size)
        vis = model.encode_images(p.pixel_values, p.grids)
        h = model(p.ids, torch.from_numpy(pos), attn, vis)
        got = [pick(model.compute_logits(h[-1:]))]
        for i in range(63):
            # Decode positions are 1-D: sequence index + rope delta == next_start + i.
            h = model(torch.tensor(got[-1:]), torch.tensor([next_start + i]), attn)
            got.append(pick(model.compute_logits(h)))
    assert len(want) == 64
    assert len(set(want)) > 3, 'degenerate reference output proves nothing'
    assert got == want


def test_1d_positions_match_3d(tiny_ckpt):
    model = load_model(tiny_ckpt)
    pos1 = torch.arange(5, 40)
    rot = model.language_model.rotary_emb
    for a, b in zip(rot(pos1, torch.float32), rot(pos1.expand(3, -1), torch.float32),
                    strict=True):
        assert torch.equal(a, b)
    ids = build_prompt(tiny_ckpt, [([], 'Turn left at the shelf.', None)]).ids
    with torch.no_grad():
        n = len(ids)
        h1 = model(ids, torch.arange(n), ContiguousAttention(3))
        h3 = model(ids, torch.arange(n).expand(3, -1), ContiguousAttention(3))
    assert torch.equal(h1, h3)


def test_causal_attention_bottom_right_gqa():
    g = torch.Generator().manual_seed(0)
    prefix, n, hq, hkv, d = 5, 4, 4, 2, 8
    q = torch.randn(n, hq, d, generator=g)
    k, v = (torch.randn(prefix + n, hkv, d, generator=g) for _ in range(2))
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = torch.einsum('qhd,khd->hqk', q, kk) * d ** -0.5
    allowed = torch.arange(prefix + n)[None, :] <= prefix + torch.arange(n)[:, None]
    want = torch.einsum('hqk,khd->qhd', scores.masked_fill(~allowed, -torch.inf).softmax(-1), vv)
    torch.testing.assert_close(causal_attention(q, k, v, prefix), want)


# ---------------------------------------------------------------- other checkpoint shapes

@pytest.mark.parametrize('variant_ckpt', ['default', *VARIANTS], indirect=True)
def test_shapes_two_images(variant_ckpt):
    model = load_model(variant_ckpt)
    p = build_prompt(variant_ckpt, TWO_IMAGES)
    assert_vision_parity(model, variant_ckpt, p)
    assert_logits_parity(model, variant_ckpt, p)


# ---------------------------------------------------------------- mutations must fail parity

def _mutated_model_fails(ckpt):
    model = load_model(ckpt)  # built after the patch, so patched buffers are in effect
    p = build_prompt(ckpt, TWO_IMAGES)
    with pytest.raises(AssertionError):
        assert_logits_parity(model, ckpt, p)
    return model, p


def test_mutation_no_vision_rope(tiny_ckpt, monkeypatch):
    monkeypatch.setattr(qwen3_vl_vision, 'apply_rope_vision', lambda q, k, cos, sin: (q, k))
    model, p = _mutated_model_fails(tiny_ckpt)
    with pytest.raises(AssertionError):
        assert_vision_parity(model, tiny_ckpt, p)


def test_mutation_interpolation_without_align_corners(tiny_ckpt, monkeypatch):
    taps = qwen3_vl_vision.interpolation_taps
    monkeypatch.setattr(qwen3_vl_vision, 'interpolation_taps',
                        lambda grid, side, merge: taps(grid, side, merge, align_corners=False))
    model, p = _mutated_model_fails(tiny_ckpt)
    with pytest.raises(AssertionError):
        assert_vision_parity(model, tiny_ckpt, p)


def test_mutation_swap_mrope_h_w(tiny_ckpt, monkeypatch):
    axis_map = rotary_embedding.mrope_axis_map
    # Swap which frequencies follow the H and the W axis.
    monkeypatch.setattr(rotary_embedding, 'mrope_axis_map',
                        lambda d, sec: (3 - axis_map(d, sec)) % 3)
    _mutated_model_fails(tiny_ckpt)


def test_mutation_skip_one_deepstack(tiny_ckpt, monkeypatch):
    add = qwen3_vl_text.add_deepstack
    calls = []

    def skip_second(h, idx, feature):
        calls.append(1)
        return h if len(calls) == 2 else add(h, idx, feature)

    monkeypatch.setattr(qwen3_vl_text, 'add_deepstack', skip_second)
    _mutated_model_fails(tiny_ckpt)
    assert len(calls) == 2


def test_bf16_matches_reference_exactly(tiny_ckpt, monkeypatch):
    """Same ops in the same order as the reference: bf16 on CPU agrees bit for bit.

    Two deliberate exceptions are taken out here and bounded separately: the patch embedding
    runs as one GEMM (the reference's Conv3d sums in another order) and several images share
    one block-diagonal-masked SDPA (the reference calls SDPA per image). With the reference's
    Conv3d swapped back in, one image's tower output is bit-identical; given the reference's
    vision features, the decoder's logits are bit-identical; and the real tower stays within
    bf16 rounding of the reference (fp32 parity is asserted by the tests above).
    """
    model = load_model(tiny_ckpt, dtype=torch.bfloat16)
    ref = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        tiny_ckpt, dtype=torch.bfloat16).eval()
    p = build_prompt(tiny_ckpt, TWO_IMAGES)
    with torch.no_grad():
        want = ref.model.get_image_features(p.pixel_values.bfloat16(), p.grids)
        got = model.encode_images(p.pixel_values, p.grids)
        embeds = torch.cat(want.pooler_output)
        rel = ((got.embeds.float() - embeds.float()).norm() / embeds.float().norm()).item()
        assert rel < 1e-2, rel
        # One image, the reference's convolution: bit for bit.
        n = int(p.grids[0].prod())
        conv = model.visual.patch_embed.proj
        monkeypatch.setattr(type(model.visual.patch_embed), 'forward',
                            lambda self, x: conv(x.to(conv.weight.dtype).view(
                                -1, *conv.weight.shape[1:])).flatten(1))
        one = model.encode_images(p.pixel_values[:n], p.grids[:1])
        assert torch.equal(one.embeds, want.pooler_output[0])
    theirs = qwen3_vl_vision.VisionOutput(
        embeds, tuple(torch.cat(level) for level in want.deepstack_features))
    monkeypatch.setattr(model, 'encode_images', lambda *args: theirs)
    want_logits = reference_logits(ref, p, model.config.image_token_id).float()
    assert torch.equal(our_logits(model, p), want_logits)
