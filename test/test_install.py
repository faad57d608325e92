# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The package as pip or colcon installs it is whole, and never reads the source tree.

A copy of the checkout is installed non-editable (``pip install --no-deps --prefix`` and
``--target``, both with ``--ignore-installed``) into a temporary directory; a fresh interpreter
whose ``sys.path`` holds that install and not the checkout then loads the demo checkpoint, makes
and runs a tiny checkpoint, reads every CUDA kernel source and finds the launch file and the YAML,
while an audit hook records every file opened inside the checkout's package, kernel, launch and
config folders (there must be none).
The environment running the tests keeps its own install of the package untouched: without
``--ignore-installed``, ``pip install --prefix`` uninstalls the running environment's copy first
(its console scripts vanished from ``.venv/bin`` after ``make test``).
"""

from importlib import metadata
import json
import os
from pathlib import Path
import shutil
import subprocess
import sys
import sysconfig

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = 'orin_llm_node'
SHARE_FOLDERS = ('launch', 'config', 'cuda_kernels')
# Top-level parts of a checkout that a package build never needs (some are large).
# (Every top-level dot entry too: .git, the virtualenvs -- .venv-vllm alone is 3.5 GB --, caches.)
NOT_BUILT = {'build', 'install', 'log', 'test', 'bench', 'tools'}

# Runs in the fresh interpreter: argv = checkout, scratch directory; prints one JSON line.
PROBE = r"""
import json, os, sys
from pathlib import Path

checkout, scratch = Path(sys.argv[1]), Path(sys.argv[2])
source_parts = tuple(str(checkout / p) for p in ('orin_llm_node', 'cuda_kernels', 'launch',
                                                 'config', 'resource', 'package.xml'))
source_reads = []


def audit(event, args):
    if event == 'open' and isinstance(args[0], (str, os.PathLike)):
        path = os.path.abspath(os.fspath(args[0]))
        if path.startswith(source_parts):
            source_reads.append(path)


sys.addaudithook(audit)

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams
from orin_llm_node.kernels import kernel_sources
from orin_llm_node.package_files import DEMO_MODEL_DIR, PACKAGE_DIR, share_dir
from orin_llm_node.testing import make_tiny_checkpoint


def answer(model_dir):
    engine = LLMEngine(EngineConfig(model_path=str(model_dir), device='cpu'))
    result = engine.chat(engine.new_conversation(), 'What colour is the shape?',
                         sampling=SamplingParams(max_tokens=3, ignore_eos=True))
    return len(result.token_ids)


share = share_dir()
print(json.dumps({
    'sys_path': sys.path,
    'package_dir': str(PACKAGE_DIR),
    'modules': sorted(m.__file__ for n, m in list(sys.modules.items())
                      if n.split('.')[0] == 'orin_llm_node'),
    'share_dir': str(share),
    'launch_file': (share / 'launch' / 'orin_llm.launch.py').is_file(),
    'yaml_has_parameters': 'ros__parameters' in (share / 'config' / 'orin_llm.yaml').read_text(),
    'kernels_dir': str(kernel_sources.kernels_dir()),
    'kernel_variants': len(kernel_sources.runtime_variants()),
    'demo_tokens': answer(DEMO_MODEL_DIR),
    'tiny_tokens': answer(make_tiny_checkpoint(scratch / 'tiny')),
    'source_reads': source_reads,
}))
"""


def _files(root):
    return sorted(p.relative_to(root).as_posix() for p in root.rglob('*')
                  if p.is_file() and '__pycache__' not in p.parts)


def _ignore(directory, names):
    """Leave out of the copy what a build never reads (caches, virtualenvs, tests, git)."""
    top = Path(directory).resolve() == REPO
    return [n for n in names if n == '__pycache__' or n.endswith('.egg-info')
            or (top and (n in NOT_BUILT or n.startswith('.')))]


@pytest.fixture(scope='module')
def source_copy(tmp_path_factory):
    """A copy of the checkout to build from: pip builds in-tree, the checkout stays untouched."""
    src = tmp_path_factory.mktemp('install') / 'src'
    shutil.copytree(REPO, src, ignore=_ignore)
    return src


def _running_install(scratch):
    """What the environment running the tests has installed of the package, as a user sees it.

    The distribution's metadata and files, its console scripts, and where a fresh interpreter
    started outside the checkout imports the package from (None where it is not installed).
    """
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    scripts = Path(sysconfig.get_path('scripts'))
    entry_points = [ep.name for ep in dist.entry_points if ep.group == 'console_scripts']
    scratch.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    found = subprocess.run([sys.executable, '-c', f'import {PACKAGE}; print({PACKAGE}.__file__)'],
                           cwd=scratch, env=env, capture_output=True, text=True, timeout=300)
    return {'version': dist.version, 'files': sorted(map(str, dist.files or [])),
            'direct_url': dist.read_text('direct_url.json'),
            'scripts': {name: (scripts / name).is_file() for name in entry_points},
            'imported_from': found.stdout.strip() or found.stderr.strip()[-300:]}


def _pip_install(source, *where):
    """Install ``source`` into ``where`` and check that the running environment kept its own."""
    before = _running_install(source.parent / 'scratch_before')
    # --ignore-installed: pip must not uninstall the running environment's copy (same name).
    cmd = [sys.executable, '-m', 'pip', 'install', '--no-deps', '--no-build-isolation',
           '--no-index', '--no-warn-script-location', '--ignore-installed', '--quiet', *where,
           str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _running_install(source.parent / 'scratch_after') == before, \
        "installing a copy changed the running environment's install"


def _probe(site, scratch):
    """Run PROBE in a fresh interpreter that sees the install at ``site``, not the checkout."""
    env = dict(os.environ, PYTHONPATH=str(site), PYTHONNOUSERSITE='1')
    scratch.mkdir()
    done = subprocess.run([sys.executable, '-c', PROBE, str(REPO), str(scratch)], cwd=scratch,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check(report, site, share):
    assert not [p for p in report['sys_path'] if p and Path(p).resolve() == REPO]
    assert Path(report['package_dir']) == site / PACKAGE
    # Every module came from the install (the editable finder of a dev venv must not win).
    assert all(Path(m).is_relative_to(site / PACKAGE) for m in report['modules']), \
        report['modules']
    assert report['source_reads'] == []
    # Every file of the package tree is installed: modules, templates, the demo checkpoint, ...
    assert _files(site / PACKAGE) == _files(REPO / PACKAGE)
    assert Path(report['share_dir']) == share
    for folder in SHARE_FOLDERS:
        assert _files(share / folder) == _files(REPO / folder), folder
    assert report['launch_file'] and report['yaml_has_parameters']
    assert Path(report['kernels_dir']) == share / 'cuda_kernels'
    assert report['kernel_variants'] > 0
    assert report['demo_tokens'] == 3 and report['tiny_tokens'] == 3


def test_prefix_install_is_whole(source_copy, tmp_path):
    """``--prefix``: the colcon / system layout, lib/pythonX.Y/site-packages + share/."""
    prefix = tmp_path / 'prefix'
    _pip_install(source_copy, '--prefix', str(prefix))
    (package,) = prefix.glob(f'lib/python*/site-packages/{PACKAGE}')
    site = package.parent
    _check(_probe(site, tmp_path / 'scratch'), site, prefix / 'share' / PACKAGE)


def test_target_install_is_whole(source_copy, tmp_path):
    """``--target``: package and share/ side by side in one directory."""
    target = tmp_path / 'target'
    _pip_install(source_copy, '--target', str(target))
    _check(_probe(target, tmp_path / 'scratch'), target, target / 'share' / PACKAGE)


def test_the_copy_leaves_out_every_virtualenv_and_cache():
    # A checkout beside `make test-vllm` holds .venv-vllm (3.5 GB): copied, it filled the disk.
    names = ['.git', '.venv', '.venv-np1', '.venv-vllm', '.hypothesis', 'orin_llm_node',
             'setup.py', 'package.xml']
    assert _ignore(REPO, names) == names[:5]
