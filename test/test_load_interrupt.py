# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Loading and warm-up stop at their next step when the caller's stop flag is set.

The node passes its stop flag (set by Ctrl-C) as ``should_stop``; test_lifecycle.py checks the
whole process over ROS, this file the loader, the engine's warm-up and the node's load helper.
"""

import threading

import pytest

from orin_llm_node.engine import EngineConfig, LLMEngine
from orin_llm_node.models import LoadInterrupted, load_model


class StopAfter:
    """A ``should_stop`` that answers True from its ``n``-th question on."""

    def __init__(self, n):
        self.n, self.asked = n, 0

    def __call__(self):
        self.asked += 1
        return self.asked >= self.n


def test_loading_stops_between_tensors(tiny_ckpt):
    stop = StopAfter(3)
    with pytest.raises(LoadInterrupted, match='stopped while loading'):
        load_model(tiny_ckpt, should_stop=stop)
    assert stop.asked == 3                  # asked before each shard and tensor, stopped at once
    never = StopAfter(10**9)
    load_model(tiny_ckpt, should_stop=never)
    assert never.asked > 20                 # every tensor of the checkpoint asks


def test_engine_and_warm_up_stop_when_asked(tiny_ckpt):
    with pytest.raises(LoadInterrupted):
        LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu'), should_stop=lambda: True)
    engine = LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu'))
    stop = StopAfter(2)
    with pytest.raises(LoadInterrupted, match='warming up'):
        engine.warmup(should_stop=stop)
    assert stop.asked == 2


def test_the_node_load_helper_stops_before_the_warm_up_turn(tiny_ckpt):
    from orin_llm_node import parameters
    from orin_llm_node.ros import model_loading
    params = {p.name: p.default for p in parameters.PARAMETERS}
    params.update(model_path=str(tiny_ckpt), device='cpu')
    flag = threading.Event()

    class Log:
        def info(self, text):
            if text.startswith('loaded in'):
                flag.set()              # a signal arrives once the weights are in

    with pytest.raises(LoadInterrupted):
        model_loading.load_engine(params, Log(), should_stop=flag.is_set)
