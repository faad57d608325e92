# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""requirements/test.txt asks for a pytest that launch_testing's pytest plugin can live with.

launch_testing's plugin (through 3.7.1) declares ``pytest_pycollect_makemodule(path, parent)``;
pytest 9 dropped ``path`` from that hook and refuses the plugin, so every pytest run in an
environment with launch_testing (``colcon test``) aborts before collecting anything.  Where
launch_testing is installed: the requirement admits no pytest that refuses the installed plugin,
the installed pytest meets the requirement, and a fresh pytest run with the plugin loaded
collects and passes a test.  Skips where launch_testing is not installed.
"""

import inspect
import os
from pathlib import Path
import subprocess
import sys

import pytest

REPO = Path(__file__).resolve().parents[1]


def _pytest_requirement():
    from packaging.requirements import Requirement
    for line in (REPO / 'requirements' / 'test.txt').read_text().splitlines():
        line = line.split('#')[0].strip()
        if line and not line.startswith('-') and Requirement(line).name == 'pytest':
            return Requirement(line)
    raise AssertionError('requirements/test.txt names no pytest')


def test_the_pytest_requirement_keeps_launch_testing_working(tmp_path):
    hooks = pytest.importorskip('launch_testing.pytest.hooks')
    from importlib import metadata

    from packaging.version import Version
    spec = _pytest_requirement().specifier
    hook = getattr(hooks, 'pytest_pycollect_makemodule', None)
    if hook is not None and 'path' in inspect.signature(hook).parameters:
        assert Version('9.0.0') not in spec, \
            f'pytest{spec} admits pytest 9, which refuses this launch_testing plugin'
    assert Version(metadata.version('pytest')) in spec, metadata.version('pytest')
    (tmp_path / 'test_trivial.py').write_text('def test_one():\n    assert True\n')
    # colcon test passes its options (junit file, --pytest-args) in PYTEST_ADDOPTS: not ours.
    env = {k: v for k, v in os.environ.items() if k != 'PYTEST_ADDOPTS'}
    done = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
                           str(tmp_path / 'test_trivial.py')], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and '1 passed' in done.stdout, done.stdout + done.stderr
