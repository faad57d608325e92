# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_serve``: the engine behind the OpenAI chat-completions API (uvicorn).

    orin_llm_serve --model-path /models/Qwen3-VL-2B-Instruct --port 8000

Bound to 127.0.0.1 unless ``--host`` says otherwise; ``--api-key-env NAME`` makes every
request carry ``Authorization: Bearer $NAME``; a request's ``Host`` must name this server
(:func:`allowed_hosts`, ``--allowed-hosts``). Needs requirements/serve.txt (FastAPI,
uvicorn). SIGINT and SIGTERM stop it alike: no new connections, answers in progress get
``GRACE_S`` to end (then they are cancelled), the engine's thread is stopped. Exit codes: 0
after a signal, 2 for a bad argument or a missing dependency, 1 when the model cannot be
loaded.
"""

import argparse
import logging
import os
from pathlib import Path
import signal
import socket
import sys

__all__ = ['allowed_hosts', 'main']

INSTALL_HINT = 'pip install -r requirements/serve.txt (fastapi, uvicorn)'
#: Seconds the answers in progress get to end after a signal, before they are cancelled.
GRACE_S = 5
_LOOPBACK = ('127.0.0.1', 'localhost', '::1')
_WILDCARD = ('0.0.0.0', '::', '')


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog='orin_llm_serve', description=__doc__.split('\n')[0])
    p.add_argument('--model-path', default='',
                   help='Qwen3-VL checkpoint directory (default: the embedded demo checkpoint)')
    p.add_argument('--served-model-name', default='',
                   help='the name clients ask for (default: the checkpoint folder name)')
    p.add_argument('--host', default='127.0.0.1',
                   help='address to listen on (default 127.0.0.1: this machine only)')
    p.add_argument('--port', type=int, default=8000)
    p.add_argument('--api-key-env', default='',
                   help='name of the environment variable holding the API key (default: none)')
    p.add_argument('--allowed-hosts', default='',
                   help="comma-separated host names a request's Host header may name besides "
                        'the defaults (the --host address, localhost, 127.0.0.1, ::1 and, '
                        "bound beyond loopback, this machine's name and any IP address); "
                        '"*" for any')
    p.add_argument('--max-queue', type=int, default=8,
                   help='requests that may wait for the engine; more are refused with 429')
    p.add_argument('--max-conversations', type=int, default=16,
                   help="conversations kept for their clients' next turns (prefix cache)")
    p.add_argument('--default-max-tokens', type=int, default=512,
                   help='max_tokens of a request that gives none')
    p.add_argument('--device', default='auto')
    p.add_argument('--dtype', default='auto')
    p.add_argument('--max-model-len', type=int, default=8192)
    p.add_argument('--kv-cache-memory-mb', type=float, default=None)
    p.add_argument('--image-max-pixels', type=int, default=None)
    p.add_argument('--no-cuda-graph', action='store_true')
    p.add_argument('--log-level', default='info', choices=['debug', 'info', 'warning', 'error'])
    return p


def _check_args(p: argparse.ArgumentParser, args) -> None:
    for name in ('max_queue', 'max_conversations', 'default_max_tokens'):
        if getattr(args, name) < 1:
            p.error(f'--{name.replace("_", "-")} must be >= 1')
    if not 0 <= args.port <= 65535:
        p.error('--port must be in [0, 65535]')


def allowed_hosts(host: str, extra: str = '') -> set[str]:
    """The names a request's ``Host`` may give for a server bound to ``host``.

    Loopback names always; the bound address itself; bound beyond loopback, this machine's
    host name and fully qualified name, and on a wildcard address any IP address (``'ip'``:
    a client that reaches the robot by address; DNS rebinding sends a name, never one);
    ``extra``, comma-separated (``*``: any).
    """
    names = {*_LOOPBACK, *(h.strip() for h in extra.split(',') if h.strip())}
    if host not in _WILDCARD:
        names.add(host)
    if host not in _LOOPBACK:
        names |= {socket.gethostname(), socket.getfqdn()}
    if host in _WILDCARD:
        names.add('ip')
    return names


def _interrupt(signum, frame):
    # SIGTERM stops the server as Ctrl-C does. uvicorn takes both signals while it serves,
    # shuts down, puts this handler back and raises the signal again: the KeyboardInterrupt
    # then ends uvicorn.run, and main stops the engine's thread and returns 0 (Python's own
    # SIGTERM action would kill the process there, the thread still answering).
    raise KeyboardInterrupt


def main(argv=None) -> int:
    """Load the engine, warm it up, serve until a signal."""
    p = _parser()
    args = p.parse_args(argv)
    _check_args(p, args)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _serve(args)
    except KeyboardInterrupt:
        return 0


def _serve(args) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as exc:
        print(f'orin_llm_serve: {exc.name} is not installed: {INSTALL_HINT}', file=sys.stderr)
        return 2
    api_key = None
    if args.api_key_env:
        api_key = os.environ.get(args.api_key_env, '').strip()
        if not api_key:
            print(f'orin_llm_serve: --api-key-env names {args.api_key_env}, which is not set',
                  file=sys.stderr)
            return 2
    logging.basicConfig(level=args.log_level.upper(),
                        format='%(asctime)s %(levelname)s %(name)s: %(message)s')
    from orin_llm_node import package_files
    from orin_llm_node.engine import EngineConfig, LLMEngine
    from orin_llm_node.serve.app import create_app
    from orin_llm_node.serve.engine_worker import EngineWorker
    path = Path(args.model_path).expanduser() if args.model_path else package_files.DEMO_MODEL_DIR
    name = args.served_model_name or path.name
    try:
        engine = LLMEngine(EngineConfig(
            model_path=path, device=args.device, dtype=args.dtype,
            max_model_len=args.max_model_len, kv_cache_memory_mb=args.kv_cache_memory_mb,
            image_max_pixels=args.image_max_pixels,
            enable_cuda_graph=not args.no_cuda_graph))
        engine.warmup()
    except Exception as exc:  # noqa: BLE001 - any load failure is one line
        print(f'orin_llm_serve: cannot load {path}: {" ".join(str(exc).split())}',
              file=sys.stderr)
        return 1
    worker = EngineWorker(engine, args.max_queue, args.max_conversations).start()
    try:
        app = create_app(worker, name, api_key=api_key,
                         default_max_tokens=args.default_max_tokens,
                         max_model_len=args.max_model_len,
                         allowed_hosts=allowed_hosts(args.host, args.allowed_hosts))
        print(f'orin_llm_serve: serving {name!r} at http://{args.host}:{args.port}/v1',
              flush=True)
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level,
                    access_log=args.log_level == 'debug', timeout_graceful_shutdown=GRACE_S)
    finally:
        worker.stop()
    return 0


if __name__ == '__main__':
    sys.exit(main())
