"""OpenEnv serving: how long ``envhub serve`` takes to answer, and the cost of a reset or step.

Starts ``envhub serve ENV`` on a free port, waits for ``/health``, then one OpenEnv
``GenericEnvClient`` plays the expert's episodes (the expert runs on a local copy of the env) over
the WebSocket session. Prints the figures and writes ``bench/results/openenv_serve.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import socket
import subprocess
import sys
import time
import urllib.request

import envhub

RESULTS = pathlib.Path(__file__).parent / "results" / "openenv_serve.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="sokoban/Sokoban-v0")
    parser.add_argument("--episodes", type=int, default=20)
    args = parser.parse_args()
    from openenv.core import GenericEnvClient

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    server = subprocess.Popen([sys.executable, "-m", "envhub", "serve", args.env, "--port", str(port)], stderr=subprocess.DEVNULL)
    try:
        while True:
            if server.poll() is not None or time.monotonic() - started > 120:
                raise SystemExit(f"envhub serve did not come up (exit code {server.returncode})")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        ready_s = time.monotonic() - started
        local, calls = envhub.make(args.env), 0
        with GenericEnvClient(base_url=f"http://127.0.0.1:{port}").sync() as client:
            started = time.monotonic()
            for seed in range(args.episodes):
                local.reset(seed=seed)
                result = client.reset(seed=seed)
                calls += 1
                while not result.done:
                    action = local.expert_action()
                    local.step(action)
                    result = client.step({"text": f"<answer>{action}</answer>"})
                    calls += 1
            played_s = time.monotonic() - started
    finally:
        server.terminate()
        server.wait(timeout=10)
    results = {"env": args.env, "episodes": args.episodes, "ready_s": ready_s, "calls": calls, "ms_per_call": 1000 * played_s / calls}
    print(f"{args.env}: server ready in {ready_s:.1f} s; {args.episodes} expert episodes, {calls} resets and steps, "
          f"{results['ms_per_call']:.1f} ms a call")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
