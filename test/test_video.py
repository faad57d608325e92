# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Video clips against transformers 5.23.0's Qwen3-VL, piece by piece and end to end (CPU, fp32).

The reference video processor (``Qwen3VLVideoProcessor``) needs torchvision, which does not
import beside the CPU torch here. Its own functions are called wherever they run without it
(``sample_frames``, ``smart_resize``, ``patchify``, the processor's ``replace_video_token`` and
text replacement, the model's ``get_rope_index``); the two torchvision calls are reproduced:
``tvF.resize`` of a uint8 CPU tensor with bicubic is ``F.interpolate(..., mode="bicubic",
antialias=True, align_corners=False)`` on the uint8 tensor itself (torchvision's
``_do_native_uint8_resize_on_cpu``), and ``tvF.normalize`` is ``(x - mean) / std`` in float32.
"""

from dataclasses import replace
from fractions import Fraction
import types

from _engine_reference import QWEN3VL_VIDEO, Reference, random_image
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.video_utils import VideoMetadata

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.processing import VideoClip, VideoProcessor

SYSTEM = 'You are a helpful assistant running on a robot. Answer briefly and precisely.'


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


@pytest.fixture(scope='module')
def vp(tiny_ckpt):
    return VideoProcessor.from_pretrained(tiny_ckpt)


def make_engine(ckpt, block_size=4, **kw):
    kw.setdefault('num_kv_blocks', 4096 // block_size)
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', block_size=block_size,
                                  block_order_seed=11 * block_size, **kw))


def moving_clip(seed, n, height, width, fps=2.0, start=0.0):
    """A clip of ``n`` frames: a bright square moving over noise, at ``fps``."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n):
        f = rng.integers(0, 96, (height, width, 3), dtype=np.uint8)
        x = (i * 7) % max(1, width - 16)
        f[height // 3:height // 3 + 16, x:x + 16] = (250, 40, 40)
        frames.append(f)
    return VideoClip(frames, [start + i / fps for i in range(n)])


# ---- the reference pipeline ------------------------------------------------------------------

def reference_processor_ns(cfg):
    """The attributes of a Qwen3VLVideoProcessor its sample_frames reads."""
    return types.SimpleNamespace(fps=cfg['fps'], min_frames=cfg['min_frames'],
                                 max_frames=cfg['max_frames'])


def reference_video(ref, clip, source_fps):
    """Sampled indices, pixel_values_videos, video_grid_thw and metadata, as the reference.

    The clip is handed over as a decoded video of ``source_fps`` (its frames' rate).
    """
    cfg = ref.video_config
    video = np.stack(clip.frames)
    meta = VideoMetadata(total_num_frames=len(video), fps=source_fps)
    idx = QWEN3VL_VIDEO.Qwen3VLVideoProcessor.sample_frames(
        reference_processor_ns(cfg), meta, fps=cfg['fps'])
    meta.frames_indices = idx
    sampled = torch.from_numpy(video[idx]).permute(0, 3, 1, 2).contiguous()
    factor = cfg['patch_size'] * cfg['merge_size']
    h, w = QWEN3VL_VIDEO.smart_resize(
        num_frames=sampled.shape[0], height=sampled.shape[2], width=sampled.shape[3],
        temporal_factor=cfg['temporal_patch_size'], factor=factor,
        min_pixels=cfg['size']['shortest_edge'], max_pixels=cfg['size']['longest_edge'])
    if (h, w) != tuple(sampled.shape[2:]):
        sampled = F.interpolate(sampled, size=[h, w], mode='bicubic', align_corners=False,
                                antialias=True)
    pixels, grid = ref.video_inputs(sampled.permute(0, 2, 3, 1).numpy())
    return idx, pixels, grid, meta


def reference_prompt_ids(ckpt, text, video_grids, metas, image_grids=()):
    """Token ids of a rendered prompt after the reference processor expands its pads."""
    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    proc = Qwen3VLProcessor.__new__(Qwen3VLProcessor)  # no torchvision video processor
    proc.image_token, proc.video_token = '<|image_pad|>', '<|video_pad|>'
    proc.vision_start_token, proc.vision_end_token = '<|vision_start|>', '<|vision_end|>'
    proc.image_processor = types.SimpleNamespace(merge_size=2)
    proc.video_processor = types.SimpleNamespace(merge_size=2, temporal_patch_size=2)
    images = {'image_grid_thw': list(image_grids)}
    videos = {'video_grid_thw': torch.cat(video_grids), 'video_metadata': metas}
    image_repl = [proc.replace_image_token(images, i) for i in range(len(image_grids))]
    video_repl = [proc.replace_video_token(videos, i) for i in range(len(metas))]
    (expanded,), _ = proc.get_text_with_replacements([text], image_repl, video_repl)
    return tok(expanded, add_special_tokens=False)['input_ids']


# ---- VideoClip -------------------------------------------------------------------------------

def test_clip_validation_names_the_problem():
    f = random_image(1, 32, 48)
    with pytest.raises(ValueError, match='zero frames'):
        VideoClip([], [])
    with pytest.raises(ValueError, match='mixed sizes'):
        VideoClip([f, random_image(2, 48, 32)], [0.0, 0.5])
    with pytest.raises(ValueError, match='increase'):
        VideoClip([f, f], [0.5, 0.5])
    with pytest.raises(ValueError, match='finite'):
        VideoClip([f, f], [0.0, float('nan')])
    with pytest.raises(ValueError, match='uint8'):
        VideoClip([f.astype(np.float32)], [0.0])
    with pytest.raises(ValueError, match='H x W x 3'):
        VideoClip([f[..., 0]], [0.0])
    with pytest.raises(ValueError, match='2 frames but 1 timestamps'):
        VideoClip([f, f], [0.0])
    clip = VideoClip(np.stack([f, f]), np.array([1.0, 1.5]))  # arrays are accepted
    assert len(clip) == 2 and clip.size == (32, 48) and clip.timestamps == (1.0, 1.5)


# ---- processing against the reference's own functions -----------------------------------------

@pytest.mark.parametrize('n, source_fps', [(8, 2.0), (5, 2.0), (21, 5.0), (10, 10.0), (9, 3.0),
                                           (6, 1.0), (1000, 2.0)])
def test_frame_sampling_matches_reference(ref, vp, n, source_fps):
    meta = VideoMetadata(total_num_frames=n, fps=source_fps)
    want = QWEN3VL_VIDEO.Qwen3VLVideoProcessor.sample_frames(
        reference_processor_ns(ref.video_config), meta, fps=ref.video_config['fps'])
    got = vp.sample_indices([i / source_fps for i in range(n)])
    np.testing.assert_array_equal(got, want)


# Clock origins: 0, 100 s, 17.25 s and a ROS epoch stamp (integer nanoseconds).
ORIGINS_NS = (0, 100 * 10**9, 17_250_000_000, 1_795_434_880_289_015_975)
# Source rates denser than the sampling fps (2), with periods of whole nanoseconds or not; at
# 2.2 fps the reference's own float division gives 29 frames of 33 (int(29.999999999999996)).
RATES = {'2.2': False, '2.5': True, '3': False, '5': True, '7': False, '10': True,
         '12.5': True, '29.97': False, '30': False, '60': False}


def clip_stamps(origin_ns, n, rate):
    """The stamps (seconds) of ``n`` frames at ``rate`` from ``origin_ns``, three ways.

    ``exact``: rationals; ``ns``: rounded to whole nanoseconds, as a ROS header holds them
    (``Fraction(stamp_ns, 10**9)``); ``float``: the nearest floats.
    """
    exact = [Fraction(origin_ns, 10**9) + i / Fraction(rate) for i in range(n)]
    return {'exact': exact, 'ns': [Fraction(round(t * 10**9), 10**9) for t in exact],
            'float': [float(t) for t in exact]}


@pytest.mark.parametrize('origin_ns', ORIGINS_NS)
def test_frame_sampling_does_not_depend_on_the_clocks_origin(ref, vp, origin_ns):
    # Against the reference given the clip's rate: the same frames for a clip stamped anywhere,
    # as exact rationals, ROS nanoseconds or floats; and the same <t seconds> for exact stamps
    # and whole-nanosecond periods.  (The times are printed to 0.1 s: where a group's time is
    # exactly halfway, x.x5, a stamp's own rounding -- a float far from 0, a period of 1/60 s
    # in nanoseconds -- decides the digit, as the reference's float division decides it.)
    cfg = ref.video_config
    f = random_image(3, 32, 32)
    for rate, whole_ns in RATES.items():
        for n in range(2, 64):
            meta = VideoMetadata(total_num_frames=n, fps=float(rate))
            want = QWEN3VL_VIDEO.Qwen3VLVideoProcessor.sample_frames(
                reference_processor_ns(cfg), meta, fps=cfg['fps'])
            want_times = [f'{t:.1f}' for t in Qwen3VLProcessor._calculate_timestamps(
                None, want, float(rate), cfg['temporal_patch_size'])]
            for kind, stamps in clip_stamps(origin_ns, n, rate).items():
                clip = VideoClip([f] * n, stamps)
                got = vp.sample_indices(clip.timestamps)
                assert got.tolist() == want.tolist(), (rate, n, kind)
                if kind == 'exact' or (kind == 'ns' and whole_ns):
                    _, times, _ = vp.layout(VideoClip([f] * len(got),
                                                      [clip.timestamps[i] for i in got]))
                    assert [f'{t:.1f}' for t in times] == want_times, (rate, n, kind)


def test_the_clips_that_lost_a_frame_far_from_0(ref, vp):
    # 10 frames at 2.5 fps from t = 100 s, 20 at 5 fps on ROS epoch stamps: int() of a float
    # span took 7.99999... for 8 frames.
    cfg = ref.video_config
    for origin_ns, n, rate in ((100 * 10**9, 10, '2.5'), (ORIGINS_NS[-1], 20, '5')):
        meta = VideoMetadata(total_num_frames=n, fps=float(rate))
        want = QWEN3VL_VIDEO.Qwen3VLVideoProcessor.sample_frames(
            reference_processor_ns(cfg), meta, fps=cfg['fps'])
        assert len(want) == 8
        for stamps in clip_stamps(origin_ns, n, rate).values():
            np.testing.assert_array_equal(vp.sample_indices(stamps), want)
    clip = moving_clip(1, 10, 32, 32, fps=2.5, start=100.0)      # floats: 100 + i / 2.5
    assert len(vp.resize(clip)) == 8


def test_jittered_clip_at_the_sampling_rate_keeps_every_frame(vp):
    # Camera stamps at 2 fps with a little jitter: the reference's int() would drop a frame
    # whenever the mean rate came out a hair above 2 fps; a clip within 5 % of fps is kept.
    times = [0.0, 0.499, 1.0, 1.498, 2.0, 2.5, 2.999, 3.49]
    assert vp.sample_indices(times).tolist() == list(range(8))


@pytest.mark.parametrize('frames, height, width', [
    (8, 448, 448), (5, 64, 96), (3, 20, 300), (4, 2000, 3000), (7, 33, 33), (2, 480, 640),
    (768, 480, 640),
])
@pytest.mark.parametrize('cap', [False, True])
def test_video_size_matches_reference(ref, vp, frames, height, width, cap):
    cfg = ref.video_config
    ours = replace(vp, cap_pixels_per_frame=cap)
    lo, hi = cfg['size']['shortest_edge'], cfg['size']['longest_edge']
    if cap:  # the reference's resize() computes this before smart_resize
        per_frame = max(min(768 * 32 * 32, hi // frames), int(lo * 1.05))
        hi = per_frame * frames
    want = QWEN3VL_VIDEO.smart_resize(num_frames=frames, height=height, width=width,
                                      temporal_factor=2, factor=32, min_pixels=lo,
                                      max_pixels=hi)
    assert ours.target_size(frames, height, width) == want


def test_single_frame_clip_is_refused_like_the_reference(vp):
    with pytest.raises(ValueError, match='at least 2 frames'):
        vp.preprocess(moving_clip(1, 1, 64, 64))
    with pytest.raises(ValueError, match='must be larger than temporal_factor'):
        QWEN3VL_VIDEO.smart_resize(num_frames=1, height=64, width=64)


@pytest.mark.parametrize('n, height, width, source_fps', [
    (5, 72, 100, 2.0),    # odd frame count: the last frame is repeated; resized (100 -> 96)
    (8, 64, 96, 2.0),     # no resize
    (21, 50, 70, 5.0),    # sampled down to 8 frames, resized 50x70 -> 64x64
    (3, 500, 300, 1.0),   # scaled down below the clip maximum
])
def test_pixels_equal_reference_bit_for_bit(ref, vp, n, height, width, source_fps):
    small = replace(vp, max_pixels=3 * 256 * 160)
    cfg = dict(ref.video_config, size={'shortest_edge': vp.min_pixels,
                                       'longest_edge': small.max_pixels})
    clip = moving_clip(n, n, height, width, fps=source_fps, start=17.25)
    ours = small.preprocess(clip)
    ref_cfg, ref.video_config = ref.video_config, cfg
    try:
        idx, pixels, grid, _ = reference_video(ref, clip, source_fps)
    finally:
        ref.video_config = ref_cfg
    assert ours.grid_thw == tuple(grid[0].tolist())
    assert torch.equal(ours.pixel_values, pixels)
    assert [clip.timestamps[i] for i in idx] == list(ours.clip.timestamps)
    # A stored clip (model size, sampled) patchifies to the same patches again.
    assert torch.equal(small.patchify(ours.clip).pixel_values, pixels)


def test_prompt_ids_and_positions_match_reference(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt)
    conv = eng.new_conversation(SYSTEM)
    clip_a = moving_clip(3, 7, 64, 96)  # odd: 4 temporal groups, the last padded
    clip_b = moving_clip(4, 4, 96, 64, start=1234.5)
    img = random_image(5, 80, 120)
    parts = ['Front camera:', img, 'Clip one:', clip_a, 'and two:', clip_b, 'What moved?']
    turn = eng.prompts.user_turn(conv.messages(), parts)
    ids = conv.token_ids + turn.token_ids
    text = eng.prompts.template.render(
        [{'role': 'system', 'content': SYSTEM}, *turn.messages])
    grids, metas = [], []
    for clip in (clip_a, clip_b):
        _, _, grid, meta = reference_video(ref, clip, 2.0)
        grids.append(grid)
        metas.append(meta)
    img_grid = ref.processor(images=[img], return_tensors='pt')['image_grid_thw']
    assert ids == reference_prompt_ids(tiny_ckpt, text, grids, metas, img_grid)
    assert b'<1.2 seconds>' in eng.tokenizer.decode(ids, False).encode()
    # M-RoPE positions: the reference's get_rope_index on the whole prompt.
    spans = [(len(conv.token_ids) + off, m) for off, m in turn.media]
    ours, _ = eng.prompts.positions(ids, spans)
    t = torch.tensor([ids])
    types_ = (t == ref.image_token_id).int() + 2 * (t == ref.video_token_id).int()
    want, _ = ref.model.model.get_rope_index(t, types_, image_grid_thw=img_grid,
                                             video_grid_thw=torch.cat(grids))
    np.testing.assert_array_equal(ours, want[:, 0].numpy())


def test_vision_tower_on_video_patches_matches_reference(tiny_ckpt, ref, vp):
    eng = make_engine(tiny_ckpt)
    processed = vp.preprocess(moving_clip(6, 5, 64, 96))  # t = 3 groups
    grid = torch.tensor([processed.grid_thw])
    with torch.no_grad():
        want = ref.model.get_video_features(processed.pixel_values, grid)
    got = eng.runner.encode_image(processed.pixel_values, processed.grid_thw)
    assert got.embeds.shape[0] == 3 * processed.tokens_per_group
    for a, b in [(got.embeds, want.pooler_output[0]),
                 *zip(got.deepstack, want.deepstack_features, strict=True)]:
        b = b[0] if isinstance(b, (list, tuple)) else b
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ---- the engine end to end -------------------------------------------------------------------

def assert_cold(ref, res, max_tokens):
    assert res.finish_reason in ('stop', 'length')
    want = ref.generate(res.prompt_token_ids, res.prompt_images, max_tokens,
                        videos=res.prompt_videos)
    assert res.token_ids == want


def test_clip_alone_matches_reference_end_to_end(tiny_ckpt, ref):
    # Everything from the caller's frames: sampling (21 frames at 5 fps -> 8), resize, pixels,
    # prompt ids (timestamps), positions and the greedy answer, against the reference pipeline.
    eng = make_engine(tiny_ckpt)
    clip = moving_clip(7, 21, 50, 70, fps=5.0)
    res = eng.chat(eng.new_conversation(SYSTEM), 'What happened?', videos=[clip],
                   sampling=SamplingParams(max_tokens=12, ignore_eos=True))
    _, pixels, grid, meta = reference_video(ref, clip, 5.0)
    text = eng.prompts.template.render(
        [{'role': 'system', 'content': SYSTEM},
         {'role': 'user', 'content': [{'type': 'video'}, {'type': 'text',
                                                          'text': 'What happened?'}]}])
    ids = reference_prompt_ids(tiny_ckpt, text, [grid], [meta])
    assert res.prompt_token_ids == ids
    t = torch.tensor([ids])
    with torch.inference_mode():
        out = ref.model.generate(
            input_ids=t, attention_mask=torch.ones_like(t), pixel_values_videos=pixels,
            video_grid_thw=grid, mm_token_type_ids=2 * (t == ref.video_token_id).int(),
            do_sample=False, max_new_tokens=12, eos_token_id=None)
    assert res.token_ids == out[0, len(ids):].tolist()
    assert len(res.prompt_videos) == 1 and len(res.prompt_videos[0]) == 8


@pytest.mark.parametrize('frames', [4, 5])
def test_clip_plus_image_and_clip_in_second_turn(tiny_ckpt, ref, frames):
    eng = make_engine(tiny_ckpt)
    conv = eng.new_conversation(SYSTEM)
    img = random_image(12, 96, 64)
    clip = moving_clip(13, frames, 64, 96)
    r1 = eng.chat(conv, 'Where is the square?', images=[img], videos=[clip],
                  sampling=SamplingParams(max_tokens=10, ignore_eos=True))
    assert_cold(ref, r1, 10)
    clip2 = moving_clip(14, frames + 2, 96, 64)
    r2 = eng.chat(conv, ['Now this one:', clip2, 'Which way did it go?'],
                  sampling=SamplingParams(max_tokens=10, ignore_eos=True))
    assert r2.cached_tokens >= len(r1.prompt_token_ids) - 4
    assert len(r2.prompt_videos) == 2 and len(r2.prompt_images) == 1
    assert_cold(ref, r2, 10)


def hit_inside(eng, clip, question, block_size):
    """A system prompt that puts a block boundary inside the clip's span, past its first group."""
    for n in range(block_size * 4):
        system = SYSTEM + ' ' + '1' * n
        conv = eng.new_conversation(system)
        turn = eng.prompts.user_turn(conv.messages(), question, videos=[clip])
        off, ref = turn.media[0]
        s = len(conv.token_ids) + off
        # The first token that differs between two questions follows the clip's span; the
        # hit ends at the block boundary before it, which must fall after group 0's pads.
        end = s + ref.num_tokens + 2  # + <|vision_end|><|vision_end|>
        boundary = end // block_size * block_size
        if s + ref.pad_offsets[1] < boundary < s + ref.num_tokens:
            return system, s, ref
    pytest.fail('no system prompt puts a block boundary inside the clip')


@pytest.mark.parametrize('block_size, vision_cache_mb', [(16, 0), (4, 64)])
def test_hit_ending_inside_a_clip_equals_cold_run(tiny_ckpt, ref, block_size,
                                                  vision_cache_mb):
    eng = make_engine(tiny_ckpt, block_size, vision_cache_mb=vision_cache_mb)
    clip = moving_clip(21, 6, 64, 96)  # 3 groups of 6 pads
    system, s, vref = hit_inside(eng, clip, 'What moved?', block_size)
    eng.chat(eng.new_conversation(system), 'What moved?', videos=[clip],
             sampling=SamplingParams(max_tokens=4))
    res = eng.chat(eng.new_conversation(system), 'Describe the motion.', videos=[clip],
                   sampling=SamplingParams(max_tokens=12, ignore_eos=True))
    assert s + vref.pad_offsets[1] < res.cached_tokens < s + vref.num_tokens
    assert_cold(ref, res, 12)
    # The same frames with other pixels: a miss from the clip's first block on.
    other = VideoClip([f.copy() for f in clip.frames], clip.timestamps)
    other.frames[4][0, 0] ^= 1
    miss = eng.chat(eng.new_conversation(system), 'Describe the motion.', videos=[other],
                    sampling=SamplingParams(max_tokens=12, ignore_eos=True))
    assert miss.cached_tokens <= s
    assert_cold(ref, miss, 12)
    eng.reset()


# ---- several images --------------------------------------------------------------------------

def test_images_of_different_sizes_in_one_turn_and_several_turns(tiny_ckpt, ref):
    eng = make_engine(tiny_ckpt, 4)
    conv = eng.new_conversation(SYSTEM)
    a, b, c = random_image(31, 64, 160), random_image(32, 200, 96), random_image(33, 128, 128)
    r1 = eng.chat(conv, ['Left camera:', a, 'right camera:', b, 'What differs?'],
                  sampling=SamplingParams(max_tokens=10, ignore_eos=True))
    grids = {tuple(g) for g in (ref.processor(images=[x])['image_grid_thw'][0].tolist()
                                for x in (a, b))}
    assert len(grids) == 2 and len(r1.prompt_images) == 2
    assert_cold(ref, r1, 10)
    r2 = eng.chat(conv, 'And now?', images=[c, a],
                  sampling=SamplingParams(max_tokens=10, ignore_eos=True))
    assert len(r2.prompt_images) == 4 and r2.cached_tokens > len(r1.prompt_token_ids) - 4
    assert_cold(ref, r2, 10)


@pytest.mark.parametrize('which', [0, 1, 2])
def test_hit_ending_inside_any_of_several_images(tiny_ckpt, ref, which):
    block_size = 4
    eng = make_engine(tiny_ckpt, block_size)
    pad = eng.model.config.image_token_id
    images = [random_image(41, 64, 96), random_image(42, 96, 64), random_image(43, 128, 96)]
    question = ['one:', images[0], 'two:', images[1], 'three:', images[2]]
    # Make the two prompts differ right after image ``which`` so the hit ends inside it.
    first = [*question[:2 * which + 2], 'What shape is it?']
    second = [*question[:2 * which + 2], 'Describe the colours.']
    for n in range(block_size * 2):
        system = SYSTEM + ' ' + '1' * n
        conv = eng.new_conversation(system)
        turn = eng.prompts.user_turn(conv.messages(), second)
        s = len(conv.token_ids) + turn.media[which][0]
        count = turn.media[which][1].num_tokens
        if (s + count + 1) % block_size >= 2:  # the boundary falls inside image ``which``
            break
    eng.chat(eng.new_conversation(system), first, sampling=SamplingParams(max_tokens=4))
    res = eng.chat(eng.new_conversation(system), second,
                   sampling=SamplingParams(max_tokens=10, ignore_eos=True))
    assert s < res.cached_tokens < s + count
    assert res.prompt_token_ids[s:s + count] == [pad] * count
    assert_cold(ref, res, 10)
    eng.reset()


def test_clip_longer_than_the_context_is_refused_not_raised(tiny_ckpt):
    eng = make_engine(tiny_ckpt, max_model_len=200)
    conv = eng.new_conversation(SYSTEM)
    clip = moving_clip(51, 20, 128, 128)  # 10 groups of 16 pads, with their timestamps > 200
    res = eng.chat(conv, 'What happened?', videos=[clip],
                   sampling=SamplingParams(max_tokens=4))
    assert res.finish_reason == 'context_full' and res.token_ids == [] and res.error
    assert len(res.prompt_videos) == 1 and conv.num_turns == 0
    with pytest.raises(ValueError, match='VideoClip'):
        eng.chat(conv, 'What happened?', videos=[np.stack(clip.frames)])
    with pytest.raises(ValueError, match='bare clip'):
        eng.chat(conv, 'What happened?', videos=clip)
    ok = eng.chat(conv, 'Hello.', sampling=SamplingParams(max_tokens=2))
    assert ok.finish_reason in ('stop', 'length')


def test_video_max_pixels_caps_a_clip(tiny_ckpt, ref):
    # 4 frames of 448x448 are 802816 pixels; a cap of a quarter halves each side.
    eng = make_engine(tiny_ckpt, video_max_pixels=4 * 224 * 224)
    clip = moving_clip(61, 4, 448, 448)
    res = eng.chat(eng.new_conversation(), 'What moved?', videos=[clip],
                   sampling=SamplingParams(max_tokens=6, ignore_eos=True))
    assert res.prompt_videos[0].size == (224, 224)
    assert res.prompt_token_ids.count(ref.video_token_id) == 2 * 7 * 7
    assert_cold(ref, res, 6)
    assert VideoProcessor().capped(10**12).max_pixels == VideoProcessor().max_pixels
    with pytest.raises(ValueError, match='video_max_pixels'):
        EngineConfig(model_path=tiny_ckpt, video_max_pixels=0)


def test_warmup_prepares_the_clip_grid(tiny_ckpt):
    eng = make_engine(tiny_ckpt)
    tower = eng.model.visual
    eng.warmup(image_sizes=[], video_sizes=[(5, 72, 100)])  # 3 groups of 64x96
    assert len(tower._grids) == 1
    res = eng.chat(eng.new_conversation(), 'Hi', videos=[moving_clip(71, 5, 72, 100)],
                   sampling=SamplingParams(max_tokens=1))
    assert res.finish_reason in ('stop', 'length')
    assert len(tower._grids) == 1, "the clip's grid was prepared by the warm-up"
