"""``envhub serve`` in a child process, for the tests that play against it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

START_TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serving(env_id: str, *options: str) -> Iterator[str]:
    """``envhub serve ENV_ID OPTIONS`` on a free port; yields its URL once ``/health`` answers, and
    stops the server on the way out. Fails the test if it exits or does not answer in time."""
    import pytest

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "envhub", "serve", env_id, "--port", str(port), *options],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"envhub serve exited with {process.returncode}: {process.stdout.read()}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"envhub serve did not answer on {url} within {START_TIMEOUT_S} s")
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
