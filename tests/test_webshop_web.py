"""The WebShop web page: HTTP behaviour, concurrent sessions, bad requests, and a real browser."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

import markupsafe
import pytest

from envhub_webshop.oracle import Oracle
from envhub_webshop.server import COOKIE, MAX_BODY, make_server, session_code
from envhub_webshop.shop import load_shop

DATA = Path(os.environ["ENVHUB_WEBSHOP_DATA"])
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def shop():
    return load_shop(DATA)


@pytest.fixture
def server(shop):
    srv = make_server(shop, "127.0.0.1", 0, shop.goal_set.split("test"))
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


class Client:
    """A visitor with its own cookie, speaking plain HTTP/1.1."""

    def __init__(self, server):
        self.host, self.port = server.server_address[:2]
        self.cookie = None

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            headers = dict(headers or {})
            if self.cookie:
                headers["Cookie"] = f"{COOKIE}={self.cookie}"
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            text = response.read().decode("utf-8", "replace")
            set_cookie = response.getheader("Set-Cookie")
            if set_cookie:
                self.cookie = set_cookie.split(";")[0].split("=", 1)[1]
            return response.status, text, response
        finally:
            conn.close()

    def post(self, path, **fields):
        body = urllib.parse.urlencode(fields)
        return self.request("POST", path, body, {"Content-Type": "application/x-www-form-urlencoded"})


def test_pages_follow_the_state_machine(server, shop):
    client = Client(server)
    status, page, _ = client.request("GET", "/new?goal=3")
    assert status == 303 and client.cookie
    status, page, _ = client.request("GET", "/")
    goal = shop.goals[3]
    assert status == 200 and 'id="search-input"' in page and "Instruction:" in page
    status, _, response = client.post("/search", q="Men's Sandals")
    assert status == 303 and response.getheader("Location") == "/"
    status, page, _ = client.request("GET", "/")
    assert "Page 1 (Total results: " in page and page.count('class="card result"') == 10
    first = shop.search("men's sandals")[0]
    client.post("/click", target=first)
    _, page, _ = client.request("GET", "/")
    assert f'data-asin="{first}"' in page and "Buy Now" in page
    client.post("/click", target="features")
    _, page, _ = client.request("GET", "/")
    assert 'data-page="features"' in page
    client.post("/click", target="< prev")
    client.post("/click", target="buy now")
    _, page, _ = client.request("GET", "/")
    assert 'id="score"' in page and goal.asin in page
    assert f'<code id="code">{session_code(client.cookie)}</code>' in page
    assert session_code("") == "DA39A3EE5E" and len(session_code(client.cookie)) == 10
    assert client.post("/search", q="anything")[0] == 409


def test_concurrent_sessions_keep_their_own_state(server, shop):
    queries = ["sandals", "shampoo", "headphones", "coffee", "dress", "lamp", "cable", "tea"]
    clients = [Client(server) for _ in queries]
    barrier = threading.Barrier(len(clients))
    errors = []

    def shopper(i, client):
        try:
            client.request("GET", f"/new?goal={i}")
            barrier.wait(timeout=30)
            for _ in range(5):
                assert client.post("/search", q=queries[i])[0] == 303
                asin = shop.search(queries[i])[i % 3]
                assert client.post("/click", target=asin.lower())[0] == 303
                status, page, _ = client.request("GET", "/")
                assert status == 200 and f'data-asin="{asin}"' in page, f"visitor {i} sees another page"
                assert str(markupsafe.escape(shop.goals[i].instruction_text)) in page
                assert client.post("/click", target="< prev")[0] == 303
        except Exception as exc:  # reported below, in the main thread
            errors.append(f"visitor {i}: {exc!r}")

    threads = [threading.Thread(target=shopper, args=(i, c)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len({c.cookie for c in clients}) == len(clients) == len(server.sessions)
    for i, client in enumerate(clients):
        _, page, _ = client.request("GET", "/")
        assert f"Search: {queries[i]}" in page


@pytest.mark.parametrize(
    "method, path, body, headers, status",
    [
        ("PUT", "/", None, {}, 405),
        ("DELETE", "/new", None, {}, 405),
        ("BREW", "/", None, {}, 405),
        ("GET", "/search", None, {}, 405),
        ("GET", "/admin", None, {}, 404),
        ("GET", "/?x=1", None, {}, 400),
        ("GET", "/new?goal=abc", None, {}, 400),
        ("GET", "/new?goal=99999", None, {}, 404),
        ("GET", "/new?goal=%ff", None, {}, 400),
        ("GET", "/new?goal=%C2%B2", None, {}, 400),  # a superscript two: str.isdigit() says True
        ("GET", "/new?goal=" + "9" * 5000, None, {}, 400),  # past int()'s 4,300-digit limit
        ("POST", "/click", "target=buy+now", {"Content-Type": "application/x-www-form-urlencoded"}, 400),
        ("POST", "/search", "q=shoes", {"Content-Type": "application/json"}, 415),
        ("POST", "/search", "x" * (MAX_BODY + 1), {"Content-Type": "application/x-www-form-urlencoded"}, 413),
        ("POST", "/search", "q=%ff%fe", {"Content-Type": "application/x-www-form-urlencoded"}, 400),
    ],
)
def test_bad_requests_get_4xx(server, method, path, body, headers, status):
    client = Client(server)
    got, page, _ = client.request(method, path, body, headers)
    assert got == status and "<!doctype html>" in page


def test_bad_forms_in_a_session_get_4xx_and_change_nothing(server):
    client = Client(server)
    client.request("GET", "/new?goal=0")
    client.request("GET", "/")
    assert client.post("/click", target="buy now")[0] == 400  # no Buy Now on the search page
    assert client.post("/search", q="   ")[0] == 400
    assert client.post("/search", q="x" * 5000)[0] == 400
    assert client.post("/search")[0] == 400
    assert client.request("POST", "/search", "q=a&q=b", {"Content-Type": "application/x-www-form-urlencoded"})[0] == 400
    with socket.create_connection((client.host, client.port), timeout=30) as raw:
        raw.sendall(f"POST /search HTTP/1.1\r\nHost: x\r\nCookie: {COOKIE}={client.cookie}\r\n\r\n".encode())
        assert raw.recv(64).startswith(b"HTTP/1.1 411 ")
    with socket.create_connection((client.host, client.port), timeout=30) as raw:
        raw.sendall(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n")
        assert raw.recv(64).startswith(b"HTTP/1.1 414 ")
    status, page, _ = client.request("GET", "/")
    assert status == 200 and 'id="search-input"' in page


# ---------------------------------------------------------------------- a real browser


@pytest.fixture(scope="module")
def chromium():
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        apt = shutil.which("apt-get")
        if apt is None or os.geteuid() != 0:
            pytest.skip("Chromium is missing and cannot be installed here (needs apt-get as root): apt-get install chromium chromium-driver")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        done = subprocess.run([apt, "install", "-y", "-q", "chromium", "chromium-driver"], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            subprocess.run([apt, "update", "-q"], capture_output=True, env=env)
            done = subprocess.run([apt, "install", "-y", "-q", "chromium", "chromium-driver"], capture_output=True, text=True, env=env)
        if done.returncode != 0:
            pytest.skip(f"apt-get install chromium chromium-driver failed: {done.stderr.strip()[-300:]}")
    return CHROMIUM, CHROMEDRIVER


@pytest.fixture
def browser(chromium, tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium[0]
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromium[1]), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.slow
def test_a_person_can_shop_in_headless_chromium(server, shop, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    def find(css):
        return WebDriverWait(browser, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))

    def click(element, then):
        """Click, wait for the next page to replace this one, return the element ``then``."""
        from selenium.common.exceptions import WebDriverException

        def replaced(_driver):
            # staleness_of catches only StaleElementReferenceException; mid-navigation, Chromium can
            # also answer "unhandled inspector error" about the old node (seen on a loaded machine).
            try:
                element.is_enabled()
            except WebDriverException:
                return True
            return False

        element.click()
        WebDriverWait(browser, 30).until(replaced)
        return find(then)

    position = next(i for i, g in enumerate(shop.goals[:500]) if len(g.goal_options) >= 2)
    goal = shop.goals[position]
    plan = Oracle(shop).plan(goal.asin)
    browser.get(f"{server.url}/new?goal={position}")
    assert goal.instruction_text in find("#instruction").text

    find("#search-input").send_keys(plan.query)
    info = click(find("#search-button"), "#page-info")
    assert "Page 1 (Total results:" in info.text
    for _ in range(plan.page - 1):
        click(find('button[data-click="next >"]'), "#page-info")
    title = click(find(f'button[data-click="{goal.asin.lower()}"]'), "#product-title")
    assert title.text == " ".join(goal.name.split())

    sub = click(find('button[data-click="description"]'), "#subpage")
    assert sub.get_attribute("data-page") == "description"
    click(find('button[data-click="< prev"]'), "#product-title")
    for name, value in goal.goal_options.items():
        group = find(f'div[data-option="{name}"]')
        button = next(b for b in group.find_elements(By.TAG_NAME, "button") if b.get_attribute("value") == value)
        group = click(button, f'div[data-option="{name}"]')
        assert [b.get_attribute("value") for b in group.find_elements(By.CSS_SELECTOR, "button.selected")] == [value]
    score = click(find('button[data-click="buy now"]'), "#score")

    expected, _ = shop.reward(goal.asin, goal, dict(goal.goal_options))
    assert float(score.get_attribute("data-score")) == expected and score.text == f"{expected:.3f}"
    assert find("#purchased-asin").text == goal.asin

    shot = tmp_path / "score.png"
    assert browser.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 800 and height >= 600 and len(data) > 10_000


# ---------------------------------------------------------------------- the command


@pytest.mark.slow
def test_envhub_webshop_serve_runs_until_interrupted(tmp_path):
    script = Path(sys.executable).with_name("envhub")
    # SIGINT back to its default in the child: under a non-interactive shell's `cmd &` the test run
    # inherits SIGINT ignored, and so would the server (Python then installs no KeyboardInterrupt).
    proc = subprocess.Popen([str(script), "webshop", "serve", "--port", "0", "--split", "eval"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        banner = [proc.stdout.readline(), proc.stdout.readline()]
        assert "1000 products, 1000 eval goals" in banner[0], banner
        url = banner[1].split("Serving on ", 1)[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url) as response:
            assert response.status == 200 and b'id="search-input"' in response.read()
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "stopped" in out


def test_serve_without_data_says_what_to_download(tmp_path):
    from click.testing import CliRunner

    from envhub.cli import cli

    result = CliRunner().invoke(cli, ["webshop", "serve", "--data", str(tmp_path)])
    assert result.exit_code == 1
    assert "items_shuffle_1000.json" in result.output and str(tmp_path) in result.output


@pytest.mark.slow
def test_a_normal_visitor_is_served_promptly_while_300_half_open_connections_are_held(server, monkeypatch):
    import time

    from envhub_webshop.server import WebShopHandler

    monkeypatch.setattr(WebShopHandler, "timeout", 2.0)
    held = []
    try:
        for _ in range(300):  # a request line and no more: half-open
            sock = socket.create_connection(server.server_address[:2], timeout=5)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            held.append(sock)
        started = time.perf_counter()
        status, page, _ = Client(server).request("GET", "/")
        served_in = time.perf_counter() - started
        assert status == 200 and "<!doctype html>" in page
        assert served_in < 1.5, served_in  # measured: a few hundredths of a second
        # The half-open ones are dropped after the read timeout, freeing their threads.
        deadline = time.monotonic() + 10
        while threading.active_count() > 50 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert threading.active_count() <= 50
    finally:
        for sock in held:
            sock.close()


def test_connections_past_the_cap_get_an_immediate_503(shop):
    srv = make_server(shop, "127.0.0.1", 0, shop.goal_set.split("test"), max_connections=2)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    held = []
    try:
        for _ in range(2):
            sock = socket.create_connection(srv.server_address[:2], timeout=5)
            sock.sendall(b"GET / HTTP/1.1\r\n")
            held.append(sock)
        import time

        time.sleep(0.3)
        status, _, _ = Client(srv).request("GET", "/")
        assert status == 503
    finally:
        for sock in held:
            sock.close()
        srv.shutdown()
        srv.server_close()


def test_a_shoppers_session_survives_a_flood_of_cookieless_visitors(server):
    shopper = Client(server)
    shopper.request("GET", "/new?goal=3")
    status, page, _ = shopper.request("GET", "/")  # comes back: a returning visitor
    assert status == 200
    for _ in range(1_100):
        Client(server).request("GET", "/")
    status, again, _ = shopper.request("GET", "/")
    assert status == 200 and again == page  # the same session, not a new one


def test_sessions_expire_when_idle():
    from envhub_webshop.server import SessionStore, Visitor

    now = [0.0]
    store = SessionStore(max_sessions=10, idle_seconds=60, clock=lambda: now[0])
    store.put("a", Visitor(session=None))
    assert store.get("a") is not None
    now[0] = 61
    assert store.get("a") is None and len(store) == 0
