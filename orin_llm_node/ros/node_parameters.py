# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The parameter table (parameters.py) on the rclpy node: declaration and run-time updates.

:func:`declare` declares every parameter with its type, description and constraints and checks
the values once (a bad one is a :class:`~orin_llm_node.parameters.ParameterError`, one line
naming it: main() exits 2); :func:`on_set` is the node's set-parameters callback.
"""

from contextlib import contextmanager

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
    SetParametersResult,
)
import rclpy
from rclpy.exceptions import InvalidParameterTypeException, ParameterException

from orin_llm_node.parameter_values import JSON_TEXT_EXAMPLES, quoting_hint
from orin_llm_node.parameters import (
    INT_MAX,
    PARAMETERS,
    PARAMS_BY_NAME,
    RUNTIME_PARAMETERS,
    ParameterError,
    camera_topics,
    check_parameters,
    wrong_type,
)
from orin_llm_node.refusals import clip

_ROS_TYPES = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
              float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING,
              list: ParameterType.PARAMETER_STRING_ARRAY}


def declare(node, command_line=(), node_args=None):
    """Declare every parameter on ``node``, check the values once; returns name -> value.

    The values given from outside (params files, ``-p``, ``node_args``: the keyword arguments
    ``node`` was built with) are read on a short-lived twin of ``node`` that declares them as
    they come, and checked with the table before anything is declared: a bad value is one line
    in the table's words (rclpy's own range check would say less).  ``command_line``: the
    process's arguments; each ``-p name:=value`` among its ROS arguments is also declared on a
    twin that has no other arguments: beside a ``--params-file`` that sets the same
    parameter, rcl keeps both values and rclpy takes the file's when its type comes first, so
    a wrongly typed override would otherwise be ignored without a word.
    """
    rules = _param_rules(command_line)
    if rules:
        # name -> value text (a rule may name a node first: "orin_llm:name:=value").
        texts = {rule.partition(':=')[0].rpartition(':')[2]: rule.partition(':=')[2]
                 for rule in rules}
        with _twin(node, cli_args=['--ros-args', *(a for rule in rules for a in ('-p', rule))],
                   use_global_arguments=False) as twin:
            _declare(twin, [p for p in PARAMETERS if p.name in texts], texts.get, ranges=False)
    node_args = node_args or {}
    with _twin(node, automatically_declare_parameters_from_overrides=True,
               **{k: node_args[k] for k in _TWIN_ARGS if k in node_args}) as twin:
        given = {name: p.value for name, p in twin.get_parameters_by_prefix('').items()}
    _refuse_mappings(given)
    check_parameters({p.name: given.get(p.name, p.default) for p in PARAMETERS})
    values = _declare(node, PARAMETERS, given.get)
    for name in sorted(set(given) - set(PARAMS_BY_NAME)):
        if not node.has_parameter(name):
            node.get_logger().warning(f"unknown parameter '{name}' ignored (typo?)")
    return values


def _refuse_mappings(given):
    # A params file's YAML mapping becomes nested parameters ("response_format.type"): the
    # parameter itself would keep its default without a word.  Said, with how to quote it.
    for name in sorted(given):
        head = name.partition('.')[0]
        if head != name and head in PARAMS_BY_NAME:
            how = (quoting_hint(head) if head in JSON_TEXT_EXAMPLES
                   else wrong_type(head).removeprefix(f"parameter '{head}' "))
            raise ParameterError(f"parameter '{head}' was given as a YAML mapping (as "
                                 f"'{name}'), not a value: {how}")


# The node's own arguments a twin needs to see the overrides the node sees.
_TWIN_ARGS = ('cli_args', 'parameter_overrides', 'use_global_arguments')


@contextmanager
def _twin(node, **kwargs):
    # A short-lived node with node's name, namespace and context (no services, no log).
    twin = rclpy.create_node(node.get_name(), namespace=node.get_namespace(),
                             context=node.context, start_parameter_services=False,
                             enable_rosout=False, **kwargs)
    try:
        yield twin
    finally:
        twin.destroy_node()


def _param_rules(argv):
    # The "name:=value" rules of -p / --param among argv's ROS arguments, in order.
    rules, ros, args = [], False, iter(argv)
    for arg in args:
        if arg == '--ros-args':
            ros = True
        elif arg == '--':
            ros = False
        elif ros and arg in ('-p', '--param'):
            rule = next(args, '')
            if ':=' in rule:
                rules.append(rule)
    return rules


def descriptor(spec, ranges=True):
    """The ParameterDescriptor of table row ``spec``.

    Its type, description (with its choices), constraints, read-only unless run-time, and its
    bounds as rclpy's range (``ranges``), which ``ros2 param describe`` shows and rclpy
    enforces on every set.
    """
    description = spec.description + (
        f" (one of: {', '.join(spec.choices)})" if spec.choices else '')
    d = ParameterDescriptor(
        name=spec.name, type=_ROS_TYPES[type(spec.default)], description=description,
        additional_constraints=spec.constraints, read_only=not spec.runtime)
    if ranges and spec.bounds is not None:
        if isinstance(spec.default, int):
            d.integer_range = [IntegerRange(from_value=spec.bounds.low,
                                            to_value=min(spec.bounds.high, INT_MAX), step=0)]
        else:
            d.floating_point_range = [FloatingPointRange(
                from_value=float(spec.bounds.low), to_value=float(spec.bounds.high), step=0.0)]
    return d


def _declare(node, specs, given, ranges=True):
    # Declare ``specs`` on ``node``; ``given(name)``: the value given for it (for the reason).
    values = {}
    for spec in specs:
        try:
            values[spec.name] = node.declare_parameter(spec.name, spec.default,
                                                       descriptor(spec, ranges)).value
        except InvalidParameterTypeException:
            raise ParameterError(wrong_type(spec.name, given(spec.name))) from None
        except (ParameterException, TypeError, ValueError) as exc:
            raise ParameterError(f"parameter '{spec.name}': {exc}") from None
    return values


def on_set(node, params):
    """The node's set-parameters callback: only run-time parameters, only valid values."""
    values = {name: node.get_parameter(name).value for name in PARAMS_BY_NAME}
    for param in params:
        if param.name not in PARAMS_BY_NAME:
            continue
        if param.name not in RUNTIME_PARAMETERS:
            return SetParametersResult(
                successful=False, reason=f"parameter '{param.name}' is read-only at run "
                'time: restart the node (or relaunch) to change it')
        values[param.name] = param.value
    try:
        check_parameters(values)
        node.session.check_loaded(values, [p.name for p in params])
    except ParameterError as exc:
        return SetParametersResult(successful=False, reason=str(exc))
    for param in params:
        if param.name in RUNTIME_PARAMETERS:
            node.get_logger().info(
                f'{param.name} set to {clip(repr(param.value), 80)} (takes effect at the next '
                'prompt)')
    return SetParametersResult(successful=True)


def check_camera_topics(node, names, services=()):
    """``ParameterError`` when a camera would read a topic the node owns or another camera reads.

    ``names``: ``image_topics``; each camera's topics are resolved as ``node`` resolves them
    (namespace, remapping) and compared with every topic and service name of ``node`` (call it
    once they exist) and ``services`` (opened later, on activation).  An Image subscription on
    one of the node's own topics cannot even be created (another message type on that topic):
    activation would fail only after the model was loaded.
    """
    topics = [p.topic_name for p in node.publishers] + [s.topic_name for s in node.subscriptions]
    # Not in rclpy's lists: the lifecycle state machine's publisher and rcl's log topic.
    topics += [node.resolve_topic_name('~/transition_event'), '/rosout']
    seen = dict.fromkeys(topics, "this node's own topic")
    services = [s.srv_name for s in node.services] + list(services)
    seen.update(dict.fromkeys(map(node.resolve_service_name, services),
                              "this node's own service"))
    for camera in names:
        for topic in camera_topics(camera):
            try:
                resolved = node.resolve_topic_name(topic)
            except RuntimeError as exc:     # rcl's RCLError, e.g. longer than DDS allows
                raise ParameterError(f"parameter 'image_topics': camera {camera!r} is not a "
                                     f"usable topic name ({str(exc).split(', at ')[0]})"
                                     ) from None
            if resolved in seen:
                raise ParameterError(f"parameter 'image_topics': camera {camera!r} would read "
                                     f'{resolved}, {seen[resolved]}; choose another name (or '
                                     'remap it)')
            seen[resolved] = f'which camera {camera!r} reads too'
