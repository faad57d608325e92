# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``colcon build`` of a copy of this repository, as on a robot, and the install it leaves.

The copy is built in a temporary workspace (``src/orin_llm_node``) with the venv's colcon,
ament_cmake and rosidl wheels standing in for a ROS 2 installation. colcon must find exactly one
package, and the install must hold the whole of it: the generated interfaces (the ament index
names ``action/Ask.action``, whose fields are those of the generated Python type: what
``ros2 interface show`` reads), our modules and package data merged with the generated
``orin_llm_node.action`` in one Python package, one executable in ``lib/orin_llm_node/`` per
console script of setup.cfg (for ``ros2 run``), and ``launch/``, ``config/``, ``cuda_kernels/``
in share/. A fresh interpreter in the sourced workspace imports everything from the install,
the scripts run, and the action round-trip test passes against it; with ``--symlink-install``
too. Skips without colcon.
"""

import configparser
import json
import os
from pathlib import Path
import re
import shlex
import shutil
import subprocess
import sys

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = 'orin_llm_node'
COLCON = shutil.which('colcon', path=str(Path(sys.executable).parent)) or shutil.which('colcon')
if COLCON is None:
    pytest.skip('colcon is not installed (requirements/colcon.txt)', allow_module_level=True)

pytestmark = [pytest.mark.ros, pytest.mark.colcon]

# Parts of a checkout that a build never reads: build trees, and every top-level dot entry
# (git, the virtualenvs -- .venv-vllm alone is 3.5 GB --, caches).
NOT_COPIED = {'build', 'install', 'log'}
BUILD_TIMEOUT_S = 1800

# Runs in the sourced workspace; prints one JSON line.
PROBE = r"""
import importlib, json, sys
from ament_index_python.packages import get_package_share_directory, get_resource
import orin_llm_node
from orin_llm_node.action import Ask
from orin_llm_node.package_files import share_dir

entry_points = json.loads(sys.argv[1])
for target in entry_points.values():
    module, function = target.split(':')
    getattr(importlib.import_module(module), function)
index, _ = get_resource('rosidl_interfaces', 'orin_llm_node')
print(json.dumps({
    'package_file': orin_llm_node.__file__,
    'modules': sorted(m.__file__ for n, m in list(sys.modules.items())
                      if n.split('.')[0] == 'orin_llm_node' and getattr(m, '__file__', None)),
    'share_dir': str(share_dir()),
    'ament_share': get_package_share_directory('orin_llm_node'),
    'interfaces': index.split(),
    'fields': [list(part.get_fields_and_field_types())
               for part in (Ask.Goal, Ask.Result, Ask.Feedback)],
}))
"""


def _ignore(directory, names):
    top = Path(directory).resolve() == REPO
    return [n for n in names if n == '__pycache__' or n.endswith('.egg-info')
            or (top and (n in NOT_COPIED or n.startswith('.')))]


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob('*')
                  if p.is_file() and '__pycache__' not in p.parts)


def _entry_points():
    config = configparser.ConfigParser()
    config.read(REPO / 'setup.cfg')
    lines = config['options.entry_points']['console_scripts'].strip().splitlines()
    return dict(line.replace(' ', '').split('=') for line in lines)


def _action_fields(text):
    """Field names of each section of a .action file (constants and comments left out)."""
    sections = [[]]
    for line in text.splitlines():
        line = line.split('#')[0].strip()
        if line == '---':
            sections.append([])
        elif line and '=' not in line:
            sections[-1].append(line.split()[1])
    return sections


@pytest.fixture(scope='module', params=[[], ['--symlink-install']],
                ids=['install', 'symlink-install'])
def workspace(request, tmp_path_factory):
    """A colcon workspace holding a copy of the checkout, built; its install/ and the output.

    Built twice: copied files, and ``--symlink-install`` (links into the source and build
    trees, where rosidl's ``__init__.py`` and ours compete for one name).
    """
    ws = tmp_path_factory.mktemp('colcon_ws')
    shutil.copytree(REPO, ws / 'src' / PACKAGE, ignore=_ignore)
    env = dict(os.environ, PATH=f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}',
               AMENT_PREFIX_PATH=sys.prefix)
    env.pop('PYTHONPATH', None)
    done = subprocess.run(
        [COLCON, '--log-base', str(ws / 'log'), 'build', '--base-paths', str(ws / 'src'),
         '--build-base', str(ws / 'build'), '--install-base', str(ws / 'install'),
         '--event-handlers', 'console_direct+', *request.param],
        cwd=ws, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    return ws / 'install', env, done.stdout + done.stderr


def _in_workspace(install, env, command, cwd):
    """Run ``command`` (a list) in a shell that sourced the workspace's local_setup.sh."""
    # Sourced from sh, colcon's script cannot tell where it lies: it is told.
    env = dict(env, COLCON_CURRENT_PREFIX=str(install))
    line = f'. {shlex.quote(str(install / "local_setup.sh"))} && exec {shlex.join(command)}'
    return subprocess.run(['sh', '-c', line], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def test_the_repository_is_one_package(workspace):
    _, _, output = workspace
    started = [line.split()[-1] for line in output.splitlines() if line.startswith('Starting >>>')]
    assert started == [PACKAGE], output[-3000:]


def test_the_install_holds_the_interfaces_modules_scripts_and_share(workspace, tmp_path):
    install, env, _ = workspace
    prefix = install / PACKAGE
    (site,) = prefix.glob(f'lib/python*/site-packages/{PACKAGE}')
    entry_points = _entry_points()
    probe = tmp_path / 'probe.py'
    probe.write_text(PROBE)
    done = _in_workspace(install, env, [sys.executable, str(probe), json.dumps(entry_points)],
                         cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    # Every module came from the install, ours and the generated ones in one package.
    assert Path(report['package_file']) == site / '__init__.py'
    assert all(Path(m).is_relative_to(site) for m in report['modules']), report['modules']
    assert any('/action/' in m for m in report['modules'])
    assert set(_files(REPO / PACKAGE)) <= set(_files(site))
    assert (site / 'action' / '_ask.py').is_file()
    # share/: what the node reads at run time, found the way the node finds it. A symlink
    # install's modules resolve into the source tree, and so does what they find: the very files
    # the install's share/ links to.
    share = prefix / 'share' / PACKAGE
    found = Path(report['share_dir'])
    assert found == share or (site / '__init__.py').is_symlink(), found
    assert Path(report['ament_share']) == share
    for folder in ('launch', 'config', 'cuda_kernels'):
        names = _files(share / folder)
        assert names == _files(REPO / folder), folder
        assert [(found / folder / n).resolve() for n in names] == \
            [(share / folder / n).resolve() for n in names], folder
    # The interface as `ros2 interface show` finds it: named in the ament index, our file,
    # and the generated type has exactly its fields, in order.
    assert 'action/Ask.action' in report['interfaces']
    installed = (share / 'action' / 'Ask.action').read_text()
    assert installed == (REPO / 'action' / 'Ask.action').read_text()
    assert report['fields'] == _action_fields(installed)
    # One executable per console script, where `ros2 run orin_llm_node NAME` looks.
    scripts = prefix / 'lib' / PACKAGE
    assert sorted(p.name for p in scripts.iterdir()) == sorted(entry_points)
    assert all(os.access(scripts / name, os.X_OK) for name in entry_points)


@pytest.mark.parametrize('script', ['orin_llm_check', 'orin_llm_chat'])
def test_the_installed_scripts_run(workspace, tmp_path, script):
    install, env, _ = workspace
    executable = install / PACKAGE / 'lib' / PACKAGE / script
    done = _in_workspace(install, env, [str(executable), '--help'], cwd=tmp_path)
    assert done.returncode == 0 and 'usage:' in done.stdout, done.stdout + done.stderr


def test_the_action_round_trip_passes_against_the_install(workspace):
    install, env, _ = workspace
    # From the copy's test/, as the suite registered with ctest runs: the install's package.
    done = _in_workspace(install, env, [sys.executable, '-m', 'pytest', '-q', '-p',
                                        'no:cacheprovider', 'test_ask_action.py'],
                         cwd=install.parent / 'src' / PACKAGE / 'test')
    assert done.returncode == 0 and '2 passed' in done.stdout, done.stdout[-3000:] + done.stderr


# What importing launch does to logging (launch/logging/__init__.py: its logger class sets
# propagate=False on every logger made after it), for a colcon test run here, where
# launch_testing (whose pytest plugin imports launch under colcon test) is not installed.
LAUNCH_LOGGING = """
import logging


class NonPropagating(logging.getLoggerClass()):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.propagate = False


logging.setLoggerClass(NonPropagating)
"""


def test_colcon_test_runs_the_suite_from_the_install(workspace, tmp_path):
    # The ctest-registered suite, as `colcon test` runs it, on what failed under a real colcon
    # test: a warning asserted through the logger (launch's loggers do not propagate) and the
    # orin_llm_check tests against orin_llm_serve (the off-board extras of test.txt).
    install, env, _ = workspace
    (tmp_path / 'launch_logging.py').write_text(LAUNCH_LOGGING)
    env = dict(env, PYTHONPATH=str(tmp_path), PYTEST_ADDOPTS=(
        '-p launch_logging -k "falls_back_to_torch_with or backend_openai"'))
    done = _in_workspace(install, env, [
        COLCON, '--log-base', str(tmp_path / 'log'), 'test', '--build-base',
        str(install.parent / 'build'), '--install-base', str(install),
        '--event-handlers', 'console_direct+', '--return-code-on-test-failure'],
        cwd=install.parent)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert re.search(r'\b5 passed\b', done.stdout), done.stdout[-3000:]


def test_the_copy_leaves_out_every_virtualenv_and_cache():
    # A checkout beside `make test-vllm` holds .venv-vllm (3.5 GB): copied, it filled the disk.
    names = ['.git', '.venv', '.venv-np1', '.venv-vllm', '.hypothesis', 'orin_llm_node',
             'setup.py', 'package.xml']
    assert _ignore(REPO, names) == names[:5]
