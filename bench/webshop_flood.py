"""WebShop server under a flood of half-open connections: how fast a normal visitor is served.

Measured in one run against the 1,000-product shop:
- a normal page's latency with nothing else connected (the baseline);
- the same while N half-open connections (a request line and one header, then nothing) are held;
- threads and resident memory before, during, and once the read timeout has released them.

Goal: the normal page's latency during the flood within 10x the baseline (and well under a
second). Writes bench/results/webshop_flood.json.

    python bench/webshop_flood.py [--connections 300]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("ENVHUB_WEBSHOP_DATA", str(ROOT.parent / "shared" / "data" / "webshop"))

from envhub_webshop.server import READ_TIMEOUT, make_server  # noqa: E402
from envhub_webshop.shop import load_shop  # noqa: E402


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def page_seconds(address: tuple[str, int], tries: int = 20) -> float:
    """The median latency of ``GET /`` over ``tries`` fresh visitors."""
    times = []
    for _ in range(tries):
        conn = http.client.HTTPConnection(*address, timeout=30)
        started = time.perf_counter()
        conn.request("GET", "/")
        response = conn.getresponse()
        response.read()
        conn.close()
        if response.status != 200:
            raise RuntimeError(f"GET / answered {response.status}")
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "webshop_flood.json")
    args = parser.parse_args()

    shop = load_shop(os.environ["ENVHUB_WEBSHOP_DATA"])
    server = make_server(shop, "127.0.0.1", 0, shop.goal_set.split("test"))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    address = server.server_address[:2]
    figures = {"connections": args.connections, "read_timeout_seconds": READ_TIMEOUT, "max_connections": server.max_connections}
    figures["baseline"] = {"page_seconds": page_seconds(address), "threads": threading.active_count(), "resident_mb": resident_mb()}
    held = []
    for _ in range(args.connections):
        sock = socket.create_connection(address, timeout=5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: flood\r\n")
        held.append(sock)
    time.sleep(0.5)
    figures["flood"] = {"page_seconds": page_seconds(address), "threads": threading.active_count(), "resident_mb": resident_mb()}
    started = time.perf_counter()
    while threading.active_count() > figures["baseline"]["threads"] + 2 and time.perf_counter() - started < 3 * READ_TIMEOUT:
        time.sleep(0.1)
    figures["after"] = {
        "released_after_seconds": 0.5 + time.perf_counter() - started,
        "threads": threading.active_count(),
        "resident_mb": resident_mb(),
    }
    for sock in held:
        sock.close()
    server.shutdown()
    ratio = figures["flood"]["page_seconds"] / figures["baseline"]["page_seconds"]
    figures["flood_over_baseline"] = ratio
    figures["goal_met"] = ratio <= 10 and figures["flood"]["page_seconds"] < 1.0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
