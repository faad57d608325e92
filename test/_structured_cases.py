# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Response formats the structured-output tests share.

The engine's (test_structured.py, test_structured_failures.py) and the node's
(test_structured_node.py).
"""

from orin_llm_node.testing import shapes

# What the demo model can answer about its pictures, as a JSON Schema.
ROBOT_SCHEMA = shapes.ROBOT_SCHEMA
SELF_REF = {'$defs': {'a': {'$ref': '#/$defs/a'}}, '$ref': '#/$defs/a'}
# Compiles, and admits '{"a":' -- then nothing: "x" only leads back to itself.
DEAD_AFTER_KEY = {'type': 'object', 'properties': {'a': {'$ref': '#/$defs/x'}},
                  'required': ['a'], '$defs': {'x': {'$ref': '#/$defs/x'}}}
# Forces the text "<|image_pad|>" after "x" without spelling it (a group around each bar).
FORCED_VISION = r'x<(\|)image_pad(\|)>'
# One of the library's limits, hit on the first token: a regex that expands too far.
TOO_BIG = '(a{1000}){3000}'
