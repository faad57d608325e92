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


# The options of the README's commands that name a file to read, and those that write one.
_READS = ('--image', '--schema', '--tools', '--tool-results', '--video', '--params-file')
_WRITES = ('--save-image', '--save-clip')


def _bash_lines(readme):
    """The README's shell commands, continuation lines joined, in order."""
    lines = []
    for block in re.findall(r'^```bash\n(.*?)^```', readme, re.M | re.S):
        lines += block.replace('\\\n', ' ').splitlines()
    return lines


def test_every_file_a_readme_command_reads_is_in_the_repository_or_written_before():
    import shlex
    made = set()
    missing = []
    for line in _bash_lines((REPO / 'README.md').read_text()):
        command = line.split(' #')[0]
        made.update(re.findall(r'^cat > (\S+) <<', command))
        made.update(re.findall(r'> (\S+)$', command))
        try:
            words = shlex.split(command)
        except ValueError:
            continue                # a heredoc's body line
        for option, value in zip(words, words[1:], strict=False):
            if option in _WRITES:
                made.add(value.rstrip('/'))
            elif option in _READS and value.rstrip('/') not in made:
                if not (REPO / value.removeprefix('src/orin_llm_node/')).exists():
                    missing.append(f'{option} {value}: {line.strip()}')
        for name in re.findall(r'\$\(cat (\S+)\)', command):
            if name not in made:
                missing.append(f'$(cat {name}): {line.strip()}')
    assert not missing, missing
    assert {'shape.png', 'frames'} <= made


def test_the_sample_files_are_the_demo_picture_and_a_clip_of_it(tmp_path):
    import subprocess
    import sys

    import numpy as np
    from PIL import Image

    from orin_llm_node.cli.demo import sample_clip, sample_image
    out = subprocess.run([sys.executable, '-m', 'orin_llm_node.cli.demo', '--save-image',
                          str(tmp_path / 'shape.png'), '--save-clip', str(tmp_path / 'frames')],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert np.array_equal(np.asarray(Image.open(tmp_path / 'shape.png')), sample_image())
    frames = sorted((tmp_path / 'frames').iterdir())
    clip = sample_clip()
    assert len(frames) == len(clip) == 8
    for path, rgb in zip(frames, clip, strict=True):
        assert np.array_equal(np.asarray(Image.open(path)), rgb)
    # The circle moves from left to right.
    columns = [np.nonzero((rgb[120] == (255, 0, 0)).all(axis=1))[0].mean() for rgb in clip]
    assert columns == sorted(columns) and columns[-1] - columns[0] > 150
