# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The Python package for pip: ``pip install .`` and the editable install of ``make venv``.

``colcon build`` uses CMakeLists.txt instead (package.xml: ament_cmake), which also generates the
ROS interfaces (``orin_llm_node.action``); a pip install holds no generated interfaces.
"""

from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = 'orin_llm_node'
HERE = Path(__file__).resolve().parent


def _package_data():
    """Every non-Python file inside the package tree (demo checkpoint, templates, ...).

    Listed file by file (no ``**`` globs: Humble's setuptools 59 lacks them), so a file added
    anywhere under the package, subpackages included, is installed without editing this file.
    """
    root = HERE / PACKAGE
    return sorted(
        p.relative_to(root).as_posix() for p in root.rglob('*')
        if p.is_file() and p.suffix not in ('.py', '.pyc') and '__pycache__' not in p.parts)


def _share(folder):
    """``data_files`` entry installing every file of ``folder`` to share/<package>/<folder>."""
    files = sorted(f'{folder}/{p.name}' for p in (HERE / folder).iterdir() if p.is_file())
    return (f'share/{PACKAGE}/{folder}', files)


def _requirements(name):
    """Read requirements/<name>.txt: dependencies are declared there, once (``-r`` followed)."""
    found = []
    for line in (HERE / 'requirements' / f'{name}.txt').read_text().splitlines():
        line = line.split('#')[0].strip()
        if line.startswith('-r '):
            found += _requirements(Path(line[3:].strip()).stem)
        elif line:
            found.append(line)
    return found


setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*']),
    # Run-time files: package data beside the modules, the rest in share/ where ament_index and
    # orin_llm_node.package_files find them (never in the source tree).
    package_data={PACKAGE: _package_data()},
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        _share('launch'),
        _share('config'),
        _share('cuda_kernels'),
    ],
    # Only setuptools here, as in ros2/examples: on a robot numpy/OpenCV/torch come from apt or
    # JetPack, not from pip metadata. pip users install the extras below.
    install_requires=['setuptools'],
    extras_require={
        'runtime': _requirements('runtime'),
        'ros': _requirements('ros'),
        'cuda': _requirements('cuda'),
        'openai': _requirements('openai'),
        'serve': _requirements('serve'),
        'test': _requirements('test'),
    },
    # The package reads its data files from disk next to the modules.
    zip_safe=False,
    maintainer='orin_llm_node maintainers',
    maintainer_email='maintainers@orin-llm-node.dev',
    description='Qwen3-VL on the robot: a ROS 2 node with a paged KV-cache engine.',
    license='Apache-2.0',
    tests_require=['pytest'],
    # Console scripts: setup.cfg (CMakeLists.txt reads them there for colcon build).
)
