# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""ament_python package definition (works with `colcon build` and with `pip install .`)."""

from glob import glob
from pathlib import Path

from setuptools import find_packages, setup

PACKAGE = 'orin_llm_node'
HERE = Path(__file__).resolve().parent


def _requirements(name):
    """Read requirements/<name>.txt: dependencies are declared there, once."""
    lines = (HERE / 'requirements' / f'{name}.txt').read_text().splitlines()
    return [ln.split('#')[0].strip() for ln in lines if ln.split('#')[0].strip()]


setup(
    name=PACKAGE,
    version='0.1.0',
    packages=find_packages(exclude=['test', 'test.*']),
    package_data={PACKAGE: ['demo_model/*', 'ros/dds_profiles/*.xml']},
    data_files=[
        ('share/ament_index/resource_index/packages', [f'resource/{PACKAGE}']),
        (f'share/{PACKAGE}', ['package.xml']),
        (f'share/{PACKAGE}/launch', glob('launch/*.launch.py')),
        (f'share/{PACKAGE}/config', glob('config/*.yaml') + glob('config/*.xml')),
        (f'share/{PACKAGE}/cuda_kernels', glob('cuda_kernels/*.cu*')),
    ],
    # Only setuptools here, as in ros2/examples: colcon-generated entry points check
    # install_requires at start-up, and on a robot numpy/OpenCV/torch come from apt or JetPack,
    # not from pip metadata. pip users install the extras below.
    install_requires=['setuptools'],
    extras_require={
        'runtime': _requirements('runtime'),
        'ros': _requirements('ros'),
        'cuda': _requirements('cuda'),
        'test': _requirements('test'),
    },
    zip_safe=True,
    maintainer='orin_llm_node maintainers',
    maintainer_email='maintainers@orin-llm-node.dev',
    description='Qwen3-VL on the robot: a ROS 2 node with a paged KV-cache engine.',
    license='Apache-2.0',
    tests_require=['pytest'],
    entry_points={
        'console_scripts': [
            f'orin_llm_node = {PACKAGE}.ros.main:main',
            f'orin_llm_chat = {PACKAGE}.ros.chat_client:main',
        ],
    },
)
