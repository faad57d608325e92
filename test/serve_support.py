# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""orin_llm_serve (or vLLM) as a real process on loopback, for the backend and server tests."""

import os
from pathlib import Path
import signal
import socket
import subprocess
import sys
import threading
import time

from child_processes import spawn
import pytest

#: How long a server may take to load the tiny checkpoint and answer (a loaded CI machine).
START_TIMEOUT_S = 120.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Server:
    """One ``orin_llm_serve`` process; ``url`` is its API root (``.../v1``)."""

    def __init__(self, ckpt, log_path: Path, *args, port=None, env=None,
                 start_timeout_s=START_TIMEOUT_S):
        self.port = port or free_port()
        self.url = f'http://127.0.0.1:{self.port}/v1'
        self.log_path = log_path
        self.ckpt, self.args, self.env = ckpt, args, env
        self.start_timeout_s = start_timeout_s
        self.proc = None

    def command(self) -> list[str]:
        """The server's command line."""
        return [sys.executable, '-m', 'orin_llm_node.serve.main', '--model-path', str(self.ckpt),
                '--port', str(self.port), '--device', 'cpu', '--log-level', 'warning',
                *self.args]

    def start(self) -> 'Server':
        """Start the process and wait until ``/v1/models`` answers."""
        import httpx
        env = {**os.environ, **(self.env or {})}
        with open(self.log_path, 'ab') as log:
            self.proc = spawn(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f'the server exited with {self.proc.returncode}:\n{self.log()}')
            try:
                response = httpx.get(f'{self.url}/models', timeout=2.0, trust_env=False,
                                     headers=self._auth())
                if response.status_code in (200, 401):
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        pytest.fail(f'the server did not answer within {self.start_timeout_s} s:\n{self.log()}')

    def _auth(self):
        key = (self.env or {}).get('SERVE_TEST_KEY')
        return {'Authorization': f'Bearer {key}'} if key else {}

    def log(self) -> str:
        """What the server printed."""
        return self.log_path.read_text(errors='replace')[-4000:]

    def kill(self) -> None:
        """SIGKILL: the server vanishes mid-whatever, as a crashed or powered-off box."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its socket but answers nothing (a hung or slow box)."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT after ``freeze``."""
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.thaw()
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()


class RssPeak:
    """The most resident memory of a process above what it held at the start (MB), sampled.

    Sampled every 10 ms on a thread while the ``with`` block runs: what a request holds for
    longer than that shows (a body read whole, images decoded), the noise of a few MB does
    not matter beside the hundreds of MB that a missing bound costs.
    """

    def __init__(self, pid: int):
        import psutil
        self._proc = psutil.Process(pid)
        self.start_mb = self.peak_mb = self._rss()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _rss(self) -> float:
        return self._proc.memory_info().rss / 2**20

    def _sample(self):
        while not self._done.wait(0.01):
            self.peak_mb = max(self.peak_mb, self._rss())

    def __enter__(self) -> 'RssPeak':
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        self.end_mb = self._rss()

    @property
    def growth_mb(self) -> float:
        """Peak minus start."""
        return self.peak_mb - self.start_mb

    @property
    def kept_mb(self) -> float:
        """End minus start: what the process still holds."""
        return self.end_mb - self.start_mb


class HealthWatch:
    """Polls ``/health`` on a thread while the ``with`` block runs; the slowest answer (s).

    A request whose work blocks the event loop makes ``/health`` wait as long.
    """

    def __init__(self, server: Server):
        self._url = server.url.replace('/v1', '/health')
        self.slowest_s = 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self):
        import httpx
        with httpx.Client(trust_env=False, timeout=120) as client:
            while not self._done.wait(0.05):
                t0 = time.monotonic()
                client.get(self._url).raise_for_status()
                self.slowest_s = max(self.slowest_s, time.monotonic() - t0)

    def __enter__(self) -> 'HealthWatch':
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


class VLLMServer(Server):
    """vLLM's OpenAI server (the CPU build in its own venv, ``python``) on a checkpoint.

    Served as the issue of this compatibility test found it works: float32, eager, a small KV
    space, the guidance backend for structured outputs without free whitespace (our grammars
    allow none), prompt-token details on (cached tokens).
    """

    def __init__(self, python, ckpt, name, log_path: Path):
        super().__init__(ckpt, log_path, env={'VLLM_CPU_KVCACHE_SPACE': '1'},
                         start_timeout_s=600.0)
        self.python, self.name = python, name

    def command(self) -> list[str]:
        """``python -m vllm.entrypoints.openai.api_server``.

        Not ``vllm serve``: that entry point looks up the ``vllm`` distribution, and the
        registry's package is named ``vllm-cpu``.
        """
        return [self.python, '-m', 'vllm.entrypoints.openai.api_server', '--model',
                str(self.ckpt), '--served-model-name', self.name, '--host', '127.0.0.1',
                '--port', str(self.port), '--dtype', 'float32', '--enforce-eager',
                '--max-model-len', '2048', '--enable-prompt-tokens-details',
                '--structured-outputs-config',
                '{"backend": "guidance", "disable_any_whitespace": true}']
