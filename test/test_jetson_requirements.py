# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The Jetson install path: every third-party module the node imports has a provider on the robot.

Providers: JetPack (torch), apt through package.xml's rosdep keys, or pip through
requirements/jetson.txt under requirements/jetson-constraints.txt (NumPy 1.x, a CuPy and an
OpenCV whose wheels accept NumPy 1). The README's robot steps install exactly that.
"""

import ast
import sys
import xml.etree.ElementTree as ET

from conftest import REPO

PACKAGE = REPO / 'orin_llm_node'
#: import name -> (rosdep key, pip requirement); either may be None.
PROVIDERS = {
    'numpy': ('python3-numpy', None), 'cv2': ('python3-opencv', None),
    'PIL': ('python3-pil', 'pillow'), 'jinja2': ('python3-jinja2', 'jinja2'),
    'yaml': ('python3-yaml', None), 'tokenizers': (None, 'tokenizers'),
    'safetensors': (None, 'safetensors'), 'cupy': (None, 'cupy-cuda12x'),
    'llguidance': (None, 'llguidance'),
}
#: Optional extras: import name -> (its requirements file, the one folder that may import it).
#: The node never needs them: httpx only for the OpenAI-API backend, the web server only for
#: orin_llm_serve.
OPTIONAL = {'httpx': ('openai.txt', 'orin_llm_node/backends/'),
            'fastapi': ('serve.txt', 'orin_llm_node/serve/'),
            'uvicorn': ('serve.txt', 'orin_llm_node/serve/')}
JETPACK = {'torch'}
ROS = {'rclpy', 'builtin_interfaces', 'diagnostic_msgs', 'lifecycle_msgs', 'rcl_interfaces',
       'rosgraph_msgs', 'sensor_msgs', 'std_msgs', 'std_srvs', 'ament_index_python',
       'action_msgs'}


def third_party_imports(every=False):
    """Import name -> first file importing it (``every``: -> every such file)."""
    found = {}
    for path in PACKAGE.rglob('*.py'):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     else [])
            for name in names:
                top = name.split('.')[0]
                if top not in sys.stdlib_module_names and top != 'orin_llm_node':
                    found.setdefault(top, []).append(path.relative_to(REPO).as_posix())
    return found if every else {name: paths[0] for name, paths in found.items()}


def requirement_names(name):
    lines = (REPO / 'requirements' / name).read_text().splitlines()
    reqs = [ln.split('#')[0].strip() for ln in lines if ln.split('#')[0].strip()]
    return {r.split('>')[0].split('<')[0].split('=')[0].strip(): r for r in reqs}


def test_every_import_has_a_provider_on_the_robot():
    deps = {d.text for d in ET.parse(REPO / 'package.xml').getroot().iter('exec_depend')}
    jetson = requirement_names('jetson.txt')
    for module, where in third_party_imports().items():
        if module in JETPACK or module in ROS or module in OPTIONAL:
            continue
        assert module in PROVIDERS, f'{module} (imported in {where}) has no provider listed'
        key, pip = PROVIDERS[module]
        assert (key in deps) or (pip in jetson), f'{module}: neither {key} nor {pip}'
    for key, _ in PROVIDERS.values():
        assert key is None or key in deps, key
    assert 'torch' not in jetson and 'numpy' not in jetson


def test_optional_extras_stay_in_their_folders_and_need_no_numpy_or_torch():
    imports = third_party_imports(every=True)
    for module, (requirements, folder) in OPTIONAL.items():
        assert module in requirement_names(requirements), (module, requirements)
        assert all(where.startswith(folder) for where in imports.get(module, [])), (
            module, imports[module])
    for requirements in {r for r, _ in OPTIONAL.values()}:
        names = requirement_names(requirements)
        assert 'numpy' not in names and 'torch' not in names, requirements


def test_constraints_keep_numpy_1_and_pin_wheels_that_accept_it():
    c = requirement_names('jetson-constraints.txt')
    assert c['numpy'] == 'numpy<2'
    # cupy-cuda12x 14.x and opencv-python-headless 4.12+ require numpy>=2 (wheel metadata).
    assert c['cupy-cuda12x'].startswith('cupy-cuda12x==13.')
    assert c['opencv-python-headless'] == 'opencv-python-headless<4.12'
    assert 'torch' not in c and 'compressed-tensors' not in requirement_names('jetson.txt')


def test_package_xml_is_format_3_with_the_rosdep_keys():
    root = ET.parse(REPO / 'package.xml').getroot()
    assert root.tag == 'package' and root.get('format') == '3'
    deps = [d.text for d in root.iter('exec_depend')]
    assert len(deps) == len(set(deps))
    assert {'python3-numpy', 'python3-opencv', 'python3-jinja2', 'python3-pil',
            'python3-yaml'} <= set(deps)


def test_readme_robot_steps_install_the_jetson_requirements_with_constraints():
    readme = (REPO / 'README.md').read_text()
    steps = readme[readme.index('## On the robot'):readme.index('**Camera frames.**')]
    assert 'requirements/jetson.txt' in steps and '-c src/orin_llm_node/requirements/' \
        'jetson-constraints.txt' in steps
    assert 'orin_llm_check' in steps
