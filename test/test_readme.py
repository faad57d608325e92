# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The README stays true: its two commands exist, CI runs one, every parameter is listed."""

from pathlib import Path
import re

import yaml

REPO = Path(__file__).resolve().parents[1]


def test_the_two_commands_exist_and_ci_runs_the_test_command():
    readme = (REPO / 'README.md').read_text()
    makefile = (REPO / 'Makefile').read_text()
    for target in ('demo', 'test'):
        assert f'make {target}' in readme
        assert re.search(rf'^{target}:', makefile, re.M), target
    assert re.search(r'^make test$', (REPO / '.ci' / 'run').read_text(), re.M)


def test_every_parameter_is_in_the_readme_table():
    params = yaml.safe_load((REPO / 'config' / 'orin_llm.yaml').read_text())
    names = params['/**']['ros__parameters']
    readme = (REPO / 'README.md').read_text()
    missing = [n for n in names if f'`{n}`' not in readme]
    assert not missing, f'parameters missing from the README table: {missing}'
