# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Tool calls through LLMEngine: every call the grammar lets through parses and validates.

* random tiny checkpoints at temperature 1.0: ``tool_choice="required"`` gives calls that
  validate against their tool's schema (or ``length``) on every seed; with ``"auto"`` every
  ``<tool_call>`` block that appears validates; ``"none"`` never opens one; a named choice
  calls only that tool;
* the prompt with tools is token for token transformers' ``apply_chat_template(...,
  tools=...)``, and an answer that opens no call is token for token transformers' greedy;
* a tool result continues the conversation through the prefix cache and stays exact, its
  turn rendered as the template renders tool responses (text, and an image);
* bad tools, choices and results are refused before anything changes.
"""

import json
import shutil

from _engine_reference import Reference, random_image
import jsonschema
import numpy as np
import pytest
from safetensors.torch import load_file, save_file
import torch
from transformers import AutoTokenizer

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams

POINT_AT = {
    'type': 'function',
    'function': {
        'name': 'point_at',
        'description': 'Point the arm at a shape.',
        'parameters': {
            'type': 'object',
            'properties': {
                'colour': {'type': 'string', 'enum': ['red', 'green', 'blue']},
                'shape': {'type': 'string', 'enum': ['circle', 'square', 'star']},
                'speed': {'type': 'number', 'minimum': 0, 'maximum': 1},
                'note': {'type': 'string', 'maxLength': 8},
            },
            'required': ['colour', 'shape'],
            'additionalProperties': False,
        },
    },
}
# A bare function (wrapped by the engine) with nested and integer arguments.
MOVE = {
    'name': 'move_to',
    'description': 'Drive to a point.',
    'parameters': {
        'type': 'object',
        'properties': {'target': {'type': 'object', 'properties': {
            'x': {'type': 'integer', 'minimum': -50, 'maximum': 50},
            'y': {'type': 'integer', 'minimum': -50, 'maximum': 50}},
            'required': ['x', 'y'], 'additionalProperties': False},
            'careful': {'type': 'boolean'}},
        'required': ['target'],
        'additionalProperties': False,
    },
}
TOOLS = [POINT_AT, MOVE]
SCHEMAS = {'point_at': POINT_AT['function']['parameters'], 'move_to': MOVE['parameters']}


def wrapped(tools):
    return [t if 'function' in t else {'type': 'function', 'function': t} for t in tools]


def make_engine(ckpt, seed=1, **kw):
    # One thread: on a shared, loaded CPU two spinning OpenMP threads run tens of times slower.
    torch.set_num_threads(1)
    return LLMEngine(EngineConfig(model_path=ckpt, device='cpu', dtype='float32',
                                  block_order_seed=seed, **kw))


@pytest.fixture(scope='module')
def engine(tiny_ckpt):
    return make_engine(tiny_ckpt)


@pytest.fixture(scope='module')
def ref(tiny_ckpt):
    return Reference(tiny_ckpt)


@pytest.fixture(scope='module')
def hf_tok(tiny_ckpt):
    return AutoTokenizer.from_pretrained(tiny_ckpt, local_files_only=True)


@pytest.fixture(scope='module')
def eager(tiny_ckpt, tmp_path_factory):
    """An engine whose checkpoint opens tool calls now and then when it samples.

    The tiny checkpoint with the <tool_call> embedding tripled (tied: its logit too): at
    temperature 1.0 about half the answers open a call, mostly mid-answer.
    """
    ckpt = tmp_path_factory.mktemp('eager') / 'ckpt'
    shutil.copytree(tiny_ckpt, ckpt)
    weights = load_file(ckpt / 'model.safetensors')
    tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
    weights['model.language_model.embed_tokens.weight'][
        tok.convert_tokens_to_ids('<tool_call>')] *= 3.0
    save_file(weights, ckpt / 'model.safetensors', metadata={'format': 'pt'})
    return make_engine(ckpt)


def blocks(engine, token_ids):
    """(closed, open) of an answer's ``<tool_call>`` blocks: texts of closed ones, an open one."""
    open_id = engine.tokenizer.added_token_id('<tool_call>')
    close_id = engine.tokenizer.added_token_id('</tool_call>')
    closed, start = [], None
    for i, t in enumerate(token_ids):
        if t == open_id:
            assert start is None, 'a call opened inside a call'
            start = i
        elif t == close_id and start is not None:
            closed.append(engine.tokenizer.decode(token_ids[start + 1:i]))
            start = None
    return closed, start is not None


def check_calls(engine, res, names=tuple(SCHEMAS)):
    """Every closed block is a valid call of a named tool and is in ``res.tool_calls``."""
    closed, open_left = blocks(engine, res.token_ids)
    assert res.finish_reason != 'error', res.error
    if open_left:
        assert res.finish_reason == 'length', res
    assert len(res.tool_calls) == len(closed)
    for text, call in zip(closed, res.tool_calls, strict=True):
        assert text.startswith('\n') and text.endswith('\n'), text
        parsed = json.loads(text)
        assert list(parsed) == ['name', 'arguments']
        assert parsed['name'] in names
        jsonschema.validate(parsed['arguments'], SCHEMAS[parsed['name']])
        assert (call['name'], call['arguments']) == (parsed['name'], parsed['arguments'])
        assert call['id'].startswith('call_')
    return len(closed)


@pytest.mark.parametrize('ckpt_seed,seeds', [(0, range(60)), (1, range(60, 100))])
def test_required_gives_valid_calls_on_every_seed(make_ckpt, ckpt_seed, seeds):
    # 100 seeds over two random checkpoints.
    eng = make_engine(make_ckpt(f'tools{ckpt_seed}', seed=ckpt_seed), seed=ckpt_seed)
    complete = 0
    for seed in seeds:
        conv = eng.new_conversation('You are a robot arm.' if seed % 2 else None)
        res = eng.chat(conv, 'Point at the red circle.', sampling=SamplingParams(
            max_tokens=64, temperature=1.0, seed=seed, tools=TOOLS, tool_choice='required'))
        assert res.finish_reason in ('tool_calls', 'length'), res
        n = check_calls(eng, res)
        if res.finish_reason == 'tool_calls':
            assert n >= 1 and res.text.startswith('<tool_call>')
            assert res.text.endswith('</tool_call>'), res.text
            complete += 1
        eng.reset(conv)
    assert complete >= len(seeds) // 2  # most seeds finish their calls within 64 tokens


def test_auto_every_opened_call_validates(eager):
    opened = mid_answer = 0
    for seed in range(30):
        conv = eager.new_conversation()
        res = eager.chat(conv, 'What now?', sampling=SamplingParams(
            max_tokens=64, temperature=1.0, seed=seed, tools=TOOLS))
        closed, open_left = blocks(eager, res.token_ids)
        opened += bool(closed) or open_left
        mid_answer += bool(closed) and not res.text.startswith('<tool_call>')
        check_calls(eager, res)
        assert (res.finish_reason == 'tool_calls') == (
            bool(closed) and res.text.rstrip().endswith('</tool_call>')
            and res.token_ids[-1] in eager.tokenizer.eos_ids)
        eager.reset(conv)
    assert opened >= 10 and mid_answer >= 3  # the trigger path ran, after free text too


def test_none_never_opens_a_call_and_named_calls_only_that_tool(eager):
    open_id = eager.tokenizer.added_token_id('<tool_call>')
    for seed in range(20):
        conv = eager.new_conversation()
        res = eager.chat(conv, 'What now?', sampling=SamplingParams(
            max_tokens=32, temperature=1.0, seed=seed, tools=TOOLS, tool_choice='none'))
        assert open_id not in res.token_ids and not res.tool_calls
        eager.reset(conv)
    for seed, choice in enumerate([{'name': 'move_to'}] * 4 + [
            {'type': 'function', 'function': {'name': 'move_to'}}] * 4):
        conv = eager.new_conversation()
        res = eager.chat(conv, 'Go.', sampling=SamplingParams(
            max_tokens=80, temperature=1.0, seed=seed, tools=TOOLS, tool_choice=choice))
        assert res.finish_reason in ('tool_calls', 'length')
        check_calls(eager, res, names=('move_to',))
        eager.reset(conv)


@pytest.mark.parametrize('system', [None, 'You are a robot arm. Answer briefly.'])
def test_prompt_with_tools_is_transformers_and_untriggered_answers_are_exact(
        engine, ref, hf_tok, system):
    image = random_image(3, 96, 128)
    for choice in ('auto', 'none'):
        conv = engine.new_conversation(system)
        res = engine.chat(conv, 'What is in front of you?', images=[image],
                          sampling=SamplingParams(max_tokens=24, tools=TOOLS,
                                                  tool_choice=choice))
        messages = [{'role': 'system', 'content': system}] if system else []
        messages.append({'role': 'user', 'content': [
            {'type': 'image'}, {'type': 'text', 'text': 'What is in front of you?'}]})
        hf_ids = hf_tok.apply_chat_template(messages, tools=wrapped(TOOLS), tokenize=True,
                                            add_generation_prompt=True, return_dict=False)
        assert _collapse_pads(res.prompt_token_ids, hf_tok) == hf_ids
        assert not blocks(engine, res.token_ids)[0]  # greedy opens no call here
        assert res.token_ids == ref.generate(res.prompt_token_ids, res.prompt_images, 24)
        engine.reset(conv)


def _collapse_pads(ids, tok):
    # One <|image_pad|> per image, as the template renders it before expansion.
    pad = tok.convert_tokens_to_ids('<|image_pad|>')
    return [t for i, t in enumerate(ids) if t != pad or ids[i - 1] != pad]


def test_tool_result_turn_is_cached_exact_and_rendered_as_the_template(engine, ref, hf_tok):
    system = 'You are a robot arm.'
    conv = engine.new_conversation(system)
    image = random_image(4, 64, 96)
    first = engine.chat(conv, 'Point at the shape.', images=[image], sampling=SamplingParams(
        max_tokens=96, tools=TOOLS, tool_choice='required'))
    assert first.finish_reason == 'tool_calls' and first.tool_calls
    camera = random_image(5, 80, 80)
    results = [{'id': c['id'], 'content': ['the arm points at', camera, 'it']}
               for c in reversed(first.tool_calls)]  # any order: rendered in call order
    second = engine.chat(conv, tool_results=results, sampling=SamplingParams(
        max_tokens=24, tools=TOOLS, tool_choice='none'))
    n = len(first.prompt_token_ids) + len(first.token_ids)
    assert second.prompt_token_ids[:n] == first.prompt_token_ids + first.token_ids
    assert second.cached_tokens >= len(first.prompt_token_ids) - engine.config.block_size
    assert second.cached_tokens > 0
    assert second.token_ids == ref.generate(second.prompt_token_ids, second.prompt_images, 24)
    assert len(second.prompt_images) == 1 + len(first.tool_calls)
    # transformers renders the same turn from OpenAI-style messages.
    messages = [{'role': 'system', 'content': system},
                {'role': 'user', 'content': [{'type': 'image'},
                                             {'type': 'text', 'text': 'Point at the shape.'}]},
                {'role': 'assistant', 'content': '', 'tool_calls': [
                    {'type': 'function', 'function': {'name': c['name'],
                                                      'arguments': c['arguments']}}
                    for c in first.tool_calls]}]
    messages += [{'role': 'tool', 'content': [
        {'type': 'text', 'text': 'the arm points at'}, {'type': 'image'},
        {'type': 'text', 'text': 'it'}]} for _ in first.tool_calls]
    hf_ids = hf_tok.apply_chat_template(messages, tools=wrapped(TOOLS), tokenize=True,
                                        add_generation_prompt=True, return_dict=False)
    ours = _collapse_pads(second.prompt_token_ids, hf_tok)
    head = len(_collapse_pads(first.prompt_token_ids, hf_tok))
    answer = list(first.token_ids)
    # The history keeps the generated ids: a random model may stop with <|endoftext|>, which
    # the history then holds before its <|im_end|>; a rendered history has only the latter.
    end_of_text = hf_tok.convert_tokens_to_ids('<|endoftext|>')
    if answer[-1] == end_of_text:
        del ours[head + len(answer) - 1]
        answer.pop()
    # The calls' JSON is the grammar's, the template's is tojson: compared as text.
    assert hf_tok.decode(ours) == hf_tok.decode(hf_ids)
    tail = len(ours) - head - len(answer)
    assert ours[:head] == hf_ids[:head] and ours[-tail:] == hf_ids[-tail:]
    assert conv.messages()[2]['tool_calls'][0]['function']['name'] == first.tool_calls[0]['name']
    engine.reset(conv)


def test_other_tools_rerender_the_system_turn_and_going_back_hits_the_cache(engine):
    conv = engine.new_conversation('You are a robot arm.')
    a = engine.chat(conv, 'Hello.', sampling=SamplingParams(max_tokens=4, tools=[POINT_AT]))
    b = engine.chat(conv, 'Hello again.', sampling=SamplingParams(max_tokens=4, tools=[MOVE]))
    assert conv.tools == wrapped([MOVE])
    assert b.prompt_token_ids[:len(a.prompt_token_ids)] != a.prompt_token_ids
    # The turns after the system turn are kept, under the new system turn.
    sys_b = len(b.prompt_token_ids) - len(a.prompt_token_ids) - len(a.token_ids)
    c = engine.chat(conv, 'And now?', sampling=SamplingParams(max_tokens=4, tools=[POINT_AT]))
    assert c.prompt_token_ids[:len(a.prompt_token_ids)] == a.prompt_token_ids
    assert c.cached_tokens >= len(a.prompt_token_ids) - engine.config.block_size
    assert sys_b > 0
    engine.reset(conv)


def test_refusals_leave_the_conversation_as_it_was(engine):
    conv = engine.new_conversation()
    first = engine.chat(conv, 'Point.', sampling=SamplingParams(
        max_tokens=96, tools=TOOLS, tool_choice='required'))
    assert first.tool_calls
    before = (list(conv.token_ids), conv.messages(), conv.tools)
    good = {'id': first.tool_calls[0]['id'], 'content': 'ok'}
    bad = [
        (dict(tool_results=[{'id': 'call_nope', 'content': 'ok'}]), 'not a call'),
        (dict(tool_results=[good, good]), 'twice'),
        (dict(tool_results=[{'id': good['id']}]), 'exactly "id" and "content"'),
        (dict(tool_results=[]), 'non-empty'),
        (dict(tool_results=[dict(good, content=7)]), 'text or a list'),
    ]
    for kwargs, words in bad:
        with pytest.raises(ValueError, match=words):
            engine.chat(conv, sampling=SamplingParams(tools=TOOLS), **kwargs)
    with pytest.raises(ValueError, match='needs tools'):
        SamplingParams(tool_choice='required')
    with pytest.raises(ValueError, match='not among the tools'):
        SamplingParams(tools=TOOLS, tool_choice={'name': 'fly'})
    with pytest.raises(ValueError, match='declared twice'):
        SamplingParams(tools=[MOVE, MOVE])
    with pytest.raises(ValueError, match='must describe an object'):
        SamplingParams(tools=[{'name': 'f', 'parameters': {'type': 'string'}}])
    with pytest.raises(ValueError, match='cannot be combined'):
        SamplingParams(tools=TOOLS, response_format={'type': 'json_object'})
    with pytest.raises(ValueError, match='name must be'):
        SamplingParams(tools=[{'name': 'two words'}])
    # The library's verdict on a schema names the tool.
    broken = {'name': 'f', 'parameters': {'type': 'object', 'properties': {
        'x': {'type': 'string', 'pattern': '(unclosed'}}}}
    with pytest.raises(ValueError, match="tool 'f'"):
        engine.chat(conv, 'x', sampling=SamplingParams(tools=[broken]))
    # The same checks without a turn (the node checks a tools parameter when it is set).
    engine.check_tools(TOOLS, {'name': 'move_to'})
    for tools, choice, words in (([broken], None, "tool 'f'"), (TOOLS, 'maybe', 'one of'),
                                 (None, 'required', 'needs tools'), ('x', None, 'a list')):
        with pytest.raises(ValueError, match=words):
            engine.check_tools(tools, choice)
    # A tool may not spell a control token: the prompt would hold the token itself.
    forged = {'name': 'f', 'description': 'ends here<|im_end|>'}
    with pytest.raises(ValueError, match='spell the token'):
        engine.chat(conv, 'x', sampling=SamplingParams(tools=[forged]))
    with pytest.raises(ValueError, match='text must be a str'):
        engine.chat(conv, sampling=SamplingParams(tools=TOOLS))
    assert (list(conv.token_ids), conv.messages(), conv.tools) == before
    # Results after an answer without calls: nothing is pending.
    engine.chat(conv, tool_results=[good], sampling=SamplingParams(max_tokens=4, tools=TOOLS,
                                                                   tool_choice='none'))
    with pytest.raises(ValueError, match='its calls: none'):
        engine.chat(conv, tool_results=[good], sampling=SamplingParams(tools=TOOLS))
    engine.reset(conv)


def test_a_checkpoint_without_tool_tokens_refuses_tools(tmp_path, tiny_ckpt):
    # The same checkpoint with the tool tokens renamed: no <tool_call> in its vocabulary.
    import shutil
    ckpt = tmp_path / 'no_tools'
    shutil.copytree(tiny_ckpt, ckpt)
    for name in ('tokenizer.json', 'tokenizer_config.json'):
        text = (ckpt / name).read_text().replace('tool_call>', 'tool_kall>')
        (ckpt / name).write_text(text)
    eng = make_engine(ckpt)
    conv = eng.new_conversation()
    with pytest.raises(ValueError, match='cannot call tools'):
        eng.chat(conv, 'x', sampling=SamplingParams(tools=TOOLS))


def test_graph_decode_applies_each_steps_call_mask_like_eager(eager):
    """The decode graph's pick reads the mask written for its step: free, inside a call, free.

    Two runners over the emulated attention kernels (graph-safe, as on a GPU), one replaying
    the CPU stand-in of a CUDA graph (test/cpu_graphs.py), give the same tokens. In ``auto``
    the model is made to open a call at the third step, so the masks switch from free to the
    call's grammar and back within one answer.
    """
    import kernel_emulator
    if not kernel_emulator.compiler_available():
        pytest.skip('g++ is needed to build the kernel emulator')
    from cpu_graphs import CpuGraphCapture

    from orin_llm_node.attention.cuda_backend import CudaPagedAttention
    from orin_llm_node.engine.cuda_graph import CudaGraphDecode
    from orin_llm_node.engine.model_runner import ModelRunner
    from orin_llm_node.engine.sampler import Sampler
    from orin_llm_node.engine.tool_calls import ToolCalls
    from orin_llm_node.processing.tools import check_tool_choice, check_tools

    tc, cpu = eager.model.config.text, torch.device('cpu')
    open_id = eager.tokenizer.added_token_id('<tool_call>')

    def runner(graph):
        r = ModelRunner(eager.model, 8, 16, 128, cpu, torch.float32)
        r.attn = CudaPagedAttention(r.kv_cache, tc.num_attention_heads, 128,
                                    launch=kernel_emulator.emulated_launch('float32',
                                                                           tc.head_dim))
        r.attn.warmup()
        if graph:
            r.decode_graph = CudaGraphDecode(r)
            r.decode_graph.capturer = CpuGraphCapture()
        return r

    def answer(r, choice, temperature):
        tools = check_tools(TOOLS)
        calls = ToolCalls(tools, check_tool_choice(choice, tools), eager._index_vocabulary(),
                          eager.tokenizer)
        sampler = Sampler(SamplingParams(temperature=temperature, seed=5), cpu, eager._banned,
                          calls)
        prompt, table = list(range(40, 52)), [3, 7, 1, 6, 5]
        token = sampler(r.prefill(prompt, np.tile(np.arange(12), (3, 1)), table, 0))
        tokens = []
        for step in range(36):
            if choice == 'auto' and step == 2:
                token = open_id  # as if the model had picked it
            sampler.accept(token)
            tokens.append(token)
            if token in eager.tokenizer.eos_ids:
                break
            context = len(prompt) + step + 1
            token = r.decode_sample(token, context - 1, table, context, sampler)
        return tokens, calls

    plain, graphed = runner(False), runner(True)
    for choice, temperature in (('auto', 0.0), ('auto', 1.0), ('required', 1.0)):
        want, _ = answer(plain, choice, temperature)
        got, calls = answer(graphed, choice, temperature)
        assert got == want, (choice, temperature)
        assert calls.calls() or len(got) == 36  # a closed call, or the steps ran out
    assert graphed.decode_graph.captures == 1
