# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The values the node would start with, read from its params files without rclpy.

``orin_llm_check`` reads ``--params-file`` YAML and ``-p`` overrides as the node would, and
checks them with the one parameter table (parameters.py).
"""

from pathlib import Path

from orin_llm_node.parameters import (
    PARAMETERS,
    PARAMS_BY_NAME,
    ParameterError,
    check_parameters,
    from_text,
)


def values_from_files(params_files=(), overrides=(), node_name='orin_llm'):
    """The values the node would start with, read without rclpy (``orin_llm_check``).

    ``params_files``: ``--params-file`` YAML files in order (sections ``/**``, ``node_name``
    or ``/<ns>/node_name``, each with ``ros__parameters``); ``overrides``: ``name:=value``
    texts, last wins, as after ``-p``. Checked like the node's; raises ParameterError.
    """
    import yaml

    values = {p.name: p.default for p in PARAMETERS}
    for path in params_files:
        try:
            doc = yaml.safe_load(Path(path).read_text()) or {}
        except RecursionError:
            raise ParameterError(f'params file {path}: nested too deeply') from None
        except (OSError, ValueError, yaml.YAMLError) as exc:   # ValueError: not UTF-8
            raise ParameterError(f'params file {path}: {" ".join(str(exc).split())}') from None
        for section, body in _mapping(doc, path).items():
            if section == '/**' or str(section).rstrip('/').split('/')[-1] == node_name:
                given = _mapping(_mapping(body or {}, path).get('ros__parameters') or {}, path)
                values.update((k, v) for k, v in given.items() if k in PARAMS_BY_NAME)
    for text in overrides:
        name, sep, value = text.partition(':=')
        if not sep or name not in PARAMS_BY_NAME:
            raise ParameterError(f'override {text!r} is not name:=value for a node parameter')
        values[name] = from_text(name, value)
    check_parameters(values)
    return values


def _mapping(value, path):
    # A params file's document, section or ros__parameters: a mapping, else ParameterError.
    if not isinstance(value, dict):
        raise ParameterError(f'params file {path}: expected a mapping of node names to '
                             f'ros__parameters, got {type(value).__name__}')
    return value
