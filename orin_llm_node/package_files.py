# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Where the package's non-Python files are, in a checkout and in every installed copy.

Two kinds, both installed by ``setup.py``:

* package data, next to the modules (``demo_model/``, ``ros/dds_profiles/``, ...): found
  relative to the module that reads them, e.g. :data:`DEMO_MODEL_DIR`;
* the ROS share directory (``launch/``, ``config/``, ``cuda_kernels/``, ``package.xml``):
  ``<prefix>/share/orin_llm_node`` once installed, the repository root in a checkout.
  :func:`share_dir` finds the one that belongs to the imported copy of the package, so an
  installed copy never reads a source tree, and a checkout never reads a stale install.
"""

from pathlib import Path

__all__ = ['DEMO_MODEL_DIR', 'PACKAGE', 'PACKAGE_DIR', 'share_dir']

PACKAGE = 'orin_llm_node'
#: The imported package's directory (a checkout's or an install's site-packages copy).
PACKAGE_DIR = Path(__file__).resolve().parent
#: The embedded demo checkpoint (package data).
DEMO_MODEL_DIR = PACKAGE_DIR / 'demo_model'

# Every share directory holds the package manifest, so it marks a candidate as the real one.
_MARKER = 'package.xml'


def _candidates():
    # Imported from a checkout: the repository root (package.xml beside setup.py) is the share.
    if (PACKAGE_DIR.parent / 'setup.py').is_file():
        yield PACKAGE_DIR.parent
    # <prefix>/lib/pythonX.Y/site-packages/orin_llm_node: colcon, pip, Debian's dist-packages.
    if len(PACKAGE_DIR.parents) > 3:
        yield PACKAGE_DIR.parents[3] / 'share' / PACKAGE
    # pip install --target DIR: DIR/orin_llm_node and DIR/share/orin_llm_node.
    yield PACKAGE_DIR.parent / 'share' / PACKAGE
    # Any other layout of a sourced ROS workspace.
    try:
        from ament_index_python.packages import get_package_share_directory

        yield Path(get_package_share_directory(PACKAGE))
    except (ImportError, LookupError, OSError):  # no ament_index, or not on AMENT_PREFIX_PATH
        pass


def share_dir() -> Path:
    """The directory holding ``launch/``, ``config/`` and ``cuda_kernels/`` of this copy."""
    tried = []
    for cand in _candidates():
        if (cand / _MARKER).is_file():
            return cand
        tried.append(str(cand))
    raise FileNotFoundError(
        f"the {PACKAGE} share directory (launch/, config/, cuda_kernels/) was not found; "
        f"tried {', '.join(tried)}. Install the package (colcon build, or pip install .)")
