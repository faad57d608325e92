# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures; ROS isolation is set here, before anything can import rclpy."""

import logging
import os
from pathlib import Path
import sys

import pytest

# Nothing may leave this machine: localhost-only discovery (Kilted/Jazzy) and the older
# ROS_LOCALHOST_ONLY (the only one Humble honours), and a DDS domain of our own per test session
# so parallel sessions (and other developers' tests) do not see each other.
os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
os.environ['ROS_LOCALHOST_ONLY'] = '1'
os.environ.setdefault('ROS_DOMAIN_ID', str(10 + os.getpid() % 90))
# The ROS 2 wheels find their message packages through ament_index (the venv is the prefix).
os.environ.setdefault('AMENT_PREFIX_PATH', sys.prefix)

import child_processes  # noqa: E402

from orin_llm_node.testing import make_tiny_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _let_modules_skip_alone():
    """Keep launch_testing's pytest plugin from aborting the collection of this directory.

    The plugin imports every test module to look for a launch test and lets a module-level skip
    (no GPU, no transformers, ...) escape, which skips the whole ``test/`` directory under
    ``colcon test`` / ``pytest test/``. A module that skips on import holds no launch test, so
    it is handed back to pytest, which imports it again and reports that one skip.
    """
    try:
        from launch_testing.pytest import hooks
    except ImportError:  # no launch_testing, no plugin
        return
    find = hooks.find_launch_test_entrypoint

    def find_or_none(path):
        try:
            return find(path)
        except pytest.skip.Exception:
            return None

    hooks.find_launch_test_entrypoint = find_or_none


_let_modules_skip_alone()
# Servers and nodes a test starts end with the run, even one killed with SIGTERM.
child_processes.install()


@pytest.fixture(scope='session')
def ckpt_root(tmp_path_factory):
    """Session directory holding every generated tiny checkpoint."""
    return tmp_path_factory.mktemp('ckpts')


@pytest.fixture(scope='session')
def make_ckpt(ckpt_root):
    """Return a factory `make_ckpt(name, seed=0, text_config=None, vision_config=None, **top)`.

    Checkpoints are cached by name for the whole session.
    """
    made = {}

    def factory(name, seed=0, text_config=None, vision_config=None, **top_level):
        if name not in made:
            made[name] = make_tiny_checkpoint(ckpt_root / name, seed=seed,
                                              text_config=text_config,
                                              vision_config=vision_config, **top_level)
        return made[name]

    return factory


@pytest.fixture(scope='session')
def tiny_ckpt(make_ckpt):
    """The default tiny Qwen3-VL checkpoint (tied embeddings, 3 layers, DeepStack [0, 1])."""
    return make_ckpt('default')


class _Records(logging.Handler):
    def __init__(self, records: list):
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def logged():
    """Return ``logged(name)``: the list of what logger ``name`` logs during the test.

    The handler sits on that logger itself, unlike ``caplog``'s on the root: under ``colcon
    test`` launch_testing's plugin imports ``launch``, whose logger class gives every logger
    made after it ``propagate = False``, and the root then sees none of their records.
    """
    attached = []

    def attach(name: str) -> list:
        records = []
        logger = logging.getLogger(name)
        handler = _Records(records)
        logger.addHandler(handler)
        attached.append((logger, handler))
        return records

    yield attach
    for logger, handler in attached:
        logger.removeHandler(handler)


@pytest.fixture(scope='session')
def poisoned_ckpt(make_ckpt, ckpt_root):
    """The tiny untied checkpoint with a NaN lm_head row (_poisoned_checkpoint); read-only."""
    from _poisoned_checkpoint import poisoned_checkpoint
    return poisoned_checkpoint(make_ckpt, ckpt_root / 'poisoned')


def cuda_available():
    """Whether a CUDA device is usable (GPU tests skip cleanly otherwise)."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.fixture(scope='module')
def tiny_server(tiny_ckpt, tmp_path_factory):
    """orin_llm_serve on the tiny checkpoint (a real process on loopback), one per module.

    Skipped without the off-board extras (requirements/openai.txt, serve.txt; test.txt brings
    both).
    """
    for module in ('httpx', 'fastapi', 'uvicorn'):
        pytest.importorskip(module)
    from serve_support import Server
    srv = Server(tiny_ckpt, tmp_path_factory.mktemp('serve') / 'serve.log',
                 '--max-model-len', '8192').start()
    yield srv
    srv.stop()
