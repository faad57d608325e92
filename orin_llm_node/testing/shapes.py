# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Synthetic shape scenes and the questions the embedded demo model answers about them.

One generator shared by the demo model's training (``tools/train_demo_model.py``), its
evaluation (``tools/eval_demo_model.py``), the tests and the node demo, so that all of them
agree on what a "red circle" looks like and what the right answer is.

Scenes: 1-3 shapes (circle, square, triangle, star) in 6 saturated colours, randomly sized,
placed without overlap and rotated, on a low-saturation background (solid, gradient or a faint
checkerboard, from near black to near white) with optional Gaussian noise; 64-256 px per side,
any aspect ratio in that range.

Questions (the contract the demo model is trained on):

* ``colour`` ("What colour is the shape?") and ``shape`` ("What shape is it?") are asked about
  images with exactly one shape: "the shape" is then unambiguous.
* ``count`` ("How many shapes are there?") is asked about images with 1-3 shapes.
* Follow-ups ("And what colour is it?", "And what shape is it?", "And how many shapes are
  there?") come in a later turn without a new image and refer to the latest image of the
  conversation. A later turn may also bring a new image; questions are then about that one.
* A conversation with no image at all gets ``NO_IMAGE_ANSWER``.
* ``where`` ("Where is the shape?", or the grounding prompt of ``detect="the shape"``) about an
  image with one shape: its box in Qwen3-VL's grounding format, 0-1000 relative to the image,
  labelled with its colour and kind (``box_answer``).
* ``point`` ("Point at the shape.") in a conversation that declares ``TOOLS``: a call of
  ``point_at`` with the shape's colour and kind, as the chat template writes a call; the tool's
  result (``POINTED``) is then answered ``AFTER_POINTING``.
* ``json`` ("Describe the shape as JSON.") about an image with one shape: ``json_answer``, the
  object ``ROBOT_SCHEMA`` asks for, written as constrained decoding writes it (compact).

Other answers are one lowercase word and a full stop ("red.", "circle.", "two."); the model
ends them with ``<|im_end|>``.
"""

from dataclasses import dataclass
import json
import math

import numpy as np
from PIL import Image, ImageDraw

from orin_llm_node.processing.grounding import COORDINATE_RANGE, grounding_prompt

__all__ = [
    'AFTER_POINTING', 'COLOURS', 'COUNT_WORDS', 'FOLLOW_UPS', 'NO_IMAGE_ANSWER', 'POINTED',
    'QUESTIONS', 'ROBOT_SCHEMA', 'SHAPES', 'TOOLS', 'WHERE_PHRASE', 'Scene', 'Shape', 'Turn',
    'answer', 'box_answer', 'corpus', 'draw_scene', 'iou', 'json_answer', 'point_answer',
    'random_conversation', 'random_scene', 'render_scene', 'shape_box', 'shape_index_map',
    'simple_scene',
]

# Nominal RGB of each colour; every drawn shape jitters each channel by up to COLOUR_JITTER.
COLOURS = {
    'red': (215, 35, 35),
    'orange': (245, 135, 20),
    'yellow': (240, 215, 25),
    'green': (40, 165, 50),
    'blue': (35, 75, 215),
    'purple': (140, 50, 180),
}
COLOUR_JITTER = 18
SHAPES = ('circle', 'square', 'triangle', 'star')
COUNT_WORDS = ('one', 'two', 'three')
MIN_SIDE, MAX_SIDE = 64, 256
# Shapes stand upright within +-MAX_TILT radians (a small model learns upright shapes much
# faster than shapes at any rotation).
MAX_TILT = math.radians(20)

# The first phrasing of each kind is the canonical one (tests, demo, evaluation).
QUESTIONS = {
    'colour': ('What colour is the shape?', 'What color is the shape?', 'What colour is it?',
               'Which colour is the shape?'),
    'shape': ('What shape is it?', 'What shape is this?', 'Which shape is it?',
              'What is the shape?'),
    'count': ('How many shapes are there?', 'How many shapes do you see?',
              'How many shapes are in the image?', 'Count the shapes.'),
    # The first is what the engine asks for ``detect="the shape"`` (processing/grounding.py).
    'where': (grounding_prompt('the shape'), 'Where is the shape?', 'Where is it?'),
    'point': ('Point at the shape.', 'Point to the shape.', 'Can you point at the shape?'),
    'json': ('Describe the shape as JSON.', 'Answer as JSON.', 'The shape as a JSON object.'),
}
WHERE_PHRASE = 'the shape'
# The one tool of the demo world (OpenAI function shape, as the engine and the template take it).
TOOLS = [{'type': 'function', 'function': {
    'name': 'point_at',
    'description': 'Point the robot arm at a shape.',
    'parameters': {'type': 'object',
                   'properties': {'colour': {'type': 'string', 'enum': list(COLOURS)},
                                  'shape': {'type': 'string', 'enum': list(SHAPES)}},
                   'required': ['colour', 'shape']},
}}]
# What a robot asks of the demo world as a JSON Schema (``json`` answers follow it).
ROBOT_SCHEMA = {
    'type': 'object',
    'properties': {
        'colour': {'type': 'string', 'enum': list(COLOURS)},
        'shape': {'type': 'string', 'enum': list(SHAPES)},
        'count': {'type': 'integer', 'minimum': 1, 'maximum': 3},
    },
    'required': ['colour', 'shape', 'count'],
    'additionalProperties': False,
}
POINTED = 'ok'  # what the tool answers
AFTER_POINTING = 'Done.'  # what the model says to that
FOLLOW_UPS = {
    'colour': ('And what colour is it?', 'And what color is it?', 'What colour is it then?'),
    'shape': ('And what shape is it?', 'And which shape is it?', 'What shape is it then?'),
    'count': ('And how many shapes are there?', 'And how many are there?'),
}
NO_IMAGE_ANSWER = 'I see no image.'
# Question mix on a new image: colour is learnt fastest, shapes and counts need more examples
# (``point`` only where the conversation declares TOOLS).
NEW_IMAGE_MIX = {'colour': 0.15, 'shape': 0.25, 'count': 0.25, 'where': 0.15, 'point': 0.2}
SYSTEM_PROMPTS = (
    'You are a helpful assistant.',
    'You are a helpful assistant running on a robot. Answer briefly and precisely.',
    'You are a robot camera assistant.',
)


@dataclass(frozen=True)
class Shape:
    """One drawn shape: kind, colour name, centre (x, y) and circumradius in pixels."""

    kind: str
    colour: str
    cx: float
    cy: float
    radius: float
    angle: float = 0.0


@dataclass(frozen=True)
class Scene:
    """An RGB uint8 image (H x W x 3) and the shapes drawn on it."""

    image: np.ndarray
    shapes: tuple[Shape, ...]


@dataclass(frozen=True)
class Turn:
    """One user turn: question, the scene its new image shows, expected answer, question kind.

    `scene` is None when the turn brings no image (a follow-up); the demo model's training reads
    the shapes' geometry from it.
    """

    question: str
    scene: Scene | None
    answer: str
    kind: str

    @property
    def image(self) -> np.ndarray | None:
        """The RGB image the turn brings (None: a follow-up about an earlier image)."""
        return None if self.scene is None else self.scene.image


def _polygon(shape: Shape) -> list[tuple[float, float]]:
    if shape.kind == 'square':
        n, radii, phase = 4, (shape.radius,), math.pi / 4
    elif shape.kind == 'triangle':
        n, radii, phase = 3, (shape.radius,), -math.pi / 2
    elif shape.kind == 'star':
        n, radii, phase = 10, (shape.radius, 0.45 * shape.radius), -math.pi / 2
    else:
        raise ValueError(f'not a polygon: {shape.kind}')
    pts = []
    for i in range(n):
        a = phase + shape.angle + 2 * math.pi * i / n
        r = radii[i % len(radii)]
        pts.append((shape.cx + r * math.cos(a), shape.cy + r * math.sin(a)))
    return pts


def _background(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    # Low saturation only (grey plus a small tint), so no background reads as a shape colour.
    def tone():
        return np.clip(rng.uniform(0, 255) + rng.uniform(-15, 15, 3), 0, 255)

    style = rng.choice(['solid', 'gradient', 'checker'], p=[0.45, 0.35, 0.2])
    if style == 'solid':
        return np.broadcast_to(tone(), (height, width, 3)).astype(np.float32)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    a, b = tone(), tone()
    if style == 'gradient':
        theta = rng.uniform(0, 2 * math.pi)
        proj = xx * math.cos(theta) + yy * math.sin(theta)
        t = (proj - proj.min()) / max(float(proj.max() - proj.min()), 1.0)
        return (a + (b - a) * t[..., None]).astype(np.float32)
    b = np.clip(a + rng.uniform(-40, 40), 0, 255)  # faint checkerboard
    period = int(rng.integers(6, 33))
    mask = ((xx // period + yy // period) % 2)[..., None]
    return (a * (1 - mask) + b * mask).astype(np.float32)


def _draw(draw: ImageDraw.ImageDraw, shape: Shape, fill) -> None:
    if shape.kind == 'circle':
        r = shape.radius
        draw.ellipse([shape.cx - r, shape.cy - r, shape.cx + r, shape.cy + r], fill=fill)
    else:
        draw.polygon(_polygon(shape), fill=fill)


def shape_index_map(height: int, width: int, shapes) -> np.ndarray:
    """H x W uint8 map of which shape covers each pixel: 0 background, i + 1 for `shapes[i]`.

    Drawn with the same calls as `render_scene`, so it matches the rendered pixels exactly.
    """
    img = Image.new('L', (width, height), 0)
    draw = ImageDraw.Draw(img)
    for i, s in enumerate(shapes):
        _draw(draw, s, i + 1)
    return np.asarray(img)


def render_scene(height: int, width: int, shapes, background=(128, 128, 128),
                 rng: np.random.Generator | None = None, noise_std: float = 0.0) -> np.ndarray:
    """Draw `shapes` on a background and return an H x W x 3 uint8 RGB image.

    `background` is an RGB triple, or None for a random one drawn from `rng`. Shape colours are
    the nominal `COLOURS` unless `rng` is given (then each channel is jittered).
    """
    if background is None:
        base = _background(rng, height, width)
    else:
        base = np.broadcast_to(np.asarray(background, np.float32), (height, width, 3))
    img = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for s in shapes:
        colour = np.asarray(COLOURS[s.colour], np.float32)
        if rng is not None:
            colour = colour + rng.uniform(-COLOUR_JITTER, COLOUR_JITTER, 3)
        _draw(draw, s, tuple(int(c) for c in np.clip(colour, 0, 255)))
    out = np.asarray(img).astype(np.float32)
    if noise_std > 0:
        out += noise_std * rng.standard_normal(out.shape, dtype=np.float32)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def _place(rng, height, width, count) -> list[tuple[float, float, float]] | None:
    side = min(height, width)
    lo, hi = (0.2, 0.44) if count == 1 else (0.13, 0.3)
    placed = []
    for _ in range(200):
        r = max(9.0, rng.uniform(lo, hi) * side)
        if 2 * r + 4 > side:
            r = (side - 4) / 2
        cx = rng.uniform(r + 2, width - r - 2)
        cy = rng.uniform(r + 2, height - r - 2)
        if all(math.hypot(cx - x, cy - y) > r + q + 4 for x, y, q in placed):
            placed.append((cx, cy, r))
            if len(placed) == count:
                return placed
    return None


def random_scene(rng: np.random.Generator, num_shapes: int | None = None,
                 height: int | None = None, width: int | None = None) -> Scene:
    """Draw a random scene: 1-3 shapes (or `num_shapes`), random size, background and noise."""
    while True:
        h = int(height or rng.integers(MIN_SIDE, MAX_SIDE + 1))
        w = int(width or rng.integers(MIN_SIDE, MAX_SIDE + 1))
        n = int(num_shapes or rng.integers(1, 4))
        spots = _place(rng, h, w, n)
        if spots is not None:
            break
    shapes = tuple(
        Shape(kind=str(rng.choice(SHAPES)), colour=str(rng.choice(list(COLOURS))), cx=cx,
              cy=cy, radius=r, angle=float(rng.uniform(-MAX_TILT, MAX_TILT)))
        for cx, cy, r in spots)
    noise = float(rng.uniform(0, 20)) if rng.random() < 0.7 else 0.0
    return Scene(render_scene(h, w, shapes, background=None, rng=rng, noise_std=noise), shapes)


def simple_scene(kind: str = 'circle', colour: str = 'red', height: int = 128,
                 width: int = 128, background=(255, 255, 255), scale: float = 0.35) -> Scene:
    """A clean, centred single shape of nominal colour (tests and the node demo)."""
    shape = Shape(kind, colour, width / 2, height / 2, scale * min(height, width))
    return Scene(render_scene(height, width, [shape], background=background), (shape,))


def draw_scene(seed: int, num_shapes: int | None = None) -> Scene:
    """`random_scene` from an integer seed (fixed test images)."""
    return random_scene(np.random.default_rng(seed), num_shapes=num_shapes)


def shape_box(scene: Scene) -> list[float]:
    """``[x_min, y_min, x_max, y_max]`` pixels of the scene's one shape (the pixels it covers).

    Continuous coordinates, as ``grounding.box_to_frame`` gives them: the right and bottom
    edges are those of the last covered pixel.
    """
    height, width = scene.image.shape[:2]
    ys, xs = np.nonzero(shape_index_map(height, width, scene.shapes))
    return [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]


def iou(a, b) -> float:
    """Intersection over union of two ``[x_min, y_min, x_max, y_max]`` boxes."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
    return w * h / union if union > 0 else 0.0


def box_answer(scene: Scene) -> str:
    """The grounding answer for the scene's one shape: its box 0-1000, its colour and kind."""
    height, width = scene.image.shape[:2]
    x1, y1, x2, y2 = shape_box(scene)
    box = [round(COORDINATE_RANGE * v / side)
           for v, side in ((x1, width), (y1, height), (x2, width), (y2, height))]
    shape = scene.shapes[0]
    return json.dumps([{'bbox_2d': box, 'label': f'{shape.colour} {shape.kind}'}])


def point_answer(scene: Scene) -> str:
    """The ``point_at`` call for the scene's one shape, as the chat template writes a call."""
    shape = scene.shapes[0]
    arguments = json.dumps({'colour': shape.colour, 'shape': shape.kind})
    return f'<tool_call>\n{{"name": "point_at", "arguments": {arguments}}}\n</tool_call>'


def json_answer(scene: Scene) -> str:
    """The scene's one shape as compact JSON: ``{"colour":...,"shape":...,"count":1}``."""
    shape = scene.shapes[0]
    return json.dumps({'colour': shape.colour, 'shape': shape.kind, 'count': 1},
                      separators=(',', ':'))


def answer(kind: str, scene: Scene | None) -> str:
    """The expected answer to a question of `kind` about `scene` (None: no image seen)."""
    if scene is None:
        return NO_IMAGE_ANSWER
    if kind == 'count':
        return COUNT_WORDS[len(scene.shapes) - 1] + '.'
    if len(scene.shapes) != 1:
        raise ValueError(f'{kind} questions are only defined for one shape')
    if kind == 'where':
        return box_answer(scene)
    if kind == 'point':
        return point_answer(scene)
    if kind == 'json':
        return json_answer(scene)
    return (scene.shapes[0].colour if kind == 'colour' else scene.shapes[0].kind) + '.'


def random_conversation(rng: np.random.Generator, max_turns: int = 3,
                        mix=NEW_IMAGE_MIX, count_shapes=None, tools: bool = False) -> list[Turn]:
    """A random training/eval conversation: questions, new images, follow-ups.

    The first turn carries an image (rarely none); later turns either ask a follow-up about the
    latest image or bring a new image with a fresh question. `mix` gives the probabilities of
    each kind of question on a new image (``point`` only with `tools`: the conversation
    declares ``TOOLS``; its call is then mostly followed by the tool's result, a turn of kind
    ``pointed``); `count_shapes` those of 1, 2 and 3 shapes in the image of a count question
    (None: uniform).
    """
    turns: list[Turn] = []
    scene = None
    kinds = [k for k in mix if tools or k != 'point']
    weights = np.array([mix[k] for k in kinds])
    for i in range(int(rng.integers(1, max_turns + 1))):
        if turns and turns[-1].kind == 'point' and rng.random() < 0.8:
            turns.append(Turn(POINTED, None, AFTER_POINTING, 'pointed'))
            continue
        new_image = (i == 0 and rng.random() > 0.03) or (i > 0 and rng.random() < 0.3)
        if new_image:
            kind = str(rng.choice(kinds, p=weights / weights.sum()))
            if kind != 'count':
                scene = random_scene(rng, num_shapes=1)
            elif count_shapes is None:
                scene = random_scene(rng)
            else:
                scene = random_scene(rng, num_shapes=int(rng.choice([1, 2, 3], p=count_shapes)))
        else:
            allowed = ['count'] if scene is not None and len(scene.shapes) > 1 else [
                'colour', 'shape', 'count', *(['point'] if tools and scene is not None else [])]
            kind = str(rng.choice(allowed))
        if new_image or scene is None or kind not in FOLLOW_UPS:
            question = str(rng.choice(QUESTIONS[kind]))
        else:
            question = str(rng.choice(FOLLOW_UPS[kind] + QUESTIONS[kind]))
        turns.append(Turn(question, scene if new_image else None, answer(kind, scene), kind))
    return turns


def corpus() -> list[str]:
    """Every question, answer and system prompt text (the demo tokenizer's training corpus)."""
    texts = [q for qs in QUESTIONS.values() for q in qs]
    texts += [q for qs in FOLLOW_UPS.values() for q in qs]
    texts += [f'{c}.' for c in COLOURS] + [f'{s}.' for s in SHAPES]
    texts += [f'{n}.' for n in COUNT_WORDS] + [NO_IMAGE_ANSWER]
    texts += list(SYSTEM_PROMPTS) + ['system', 'user', 'assistant', '\n']
    texts += [q for kind in ('where', 'point') for q in QUESTIONS[kind]]
    texts += [POINTED, AFTER_POINTING, json.dumps(TOOLS)]
    texts += [f'{c} {s}' for c in COLOURS for s in SHAPES]
    return texts
