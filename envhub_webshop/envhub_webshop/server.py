"""The shop as web pages for people, on the same state machine as the text env.

A standard-library ``ThreadingHTTPServer`` serves Jinja2 templates. Each visitor gets a session
(an unguessable id in an HttpOnly cookie) holding one :class:`~envhub_webshop.shop.ShopSession`;
requests of one session are serialised by its lock, different sessions run in parallel and share
only the read-only shop. Forms post to ``/search`` and ``/click`` and are answered with a redirect
to ``/`` (post/redirect/get), so reloading a page never repeats an action.

Routes: ``GET /`` the current page; ``GET /new[?goal=N]`` a new task (the split's ``N``-th goal, or
a random one); ``POST /search`` (``q``); ``POST /click`` (``target``: a button text, product id or
option value of the current page). Bad requests get a 4xx page saying why.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import random
import secrets
import sys
import threading
import time
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jinja2

from envhub_webshop.shop import DONE, ITEM, RESULTS, SEARCH, SUB_PAGES, Shop, ShopSession

COOKIE = "webshop_session"
MAX_BODY = 64 * 1024
MAX_QUERY = 1000

_TEMPLATES = jinja2.Environment(
    # Next to this file rather than PackageLoader: a source checkout's outer envhub_webshop/ folder
    # can shadow the package as a namespace package when Python runs from the repository root.
    loader=jinja2.FileSystemLoader(Path(__file__).resolve().parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


#: See ``WebShopHandler.timeout``.
READ_TIMEOUT = 10.0


class BadRequest(Exception):
    """A request the server refuses, with its 4xx status and a message for the visitor."""

    def __init__(self, status: HTTPStatus, message: str):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass
class Visitor:
    """One visitor's session and the lock that serialises its requests."""

    session: ShopSession
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class SessionStore:
    """Visitors by session id, in two tiers, so that a flood of new visitors cannot evict the
    ones who are shopping.

    A session starts *new*; the first time its visitor comes back with the cookie it becomes
    *returning*. Each tier is bounded (least recently used dropped first), and a session idle for
    more than ``idle_seconds`` expires. Cookie-less requests only ever create new sessions, so a
    flood of them churns the new tier and never touches a returning visitor.
    """

    def __init__(self, max_sessions: int = 1000, max_new: int | None = None, idle_seconds: float = 3600.0, clock: Any = time.monotonic):
        self.max_sessions = max_sessions
        self.max_new = max_new if max_new is not None else max_sessions
        self.idle_seconds = idle_seconds
        self._clock = clock
        self._new: collections.OrderedDict[str, tuple[Visitor, float]] = collections.OrderedDict()
        self._returning: collections.OrderedDict[str, tuple[Visitor, float]] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, sid: str | None) -> Visitor | None:
        """Return the visitor of ``sid`` (marking it recently used, and returning), or None."""
        if not sid:
            return None
        now = self._clock()
        with self._lock:
            self._expire(now)
            entry = self._returning.pop(sid, None) or self._new.pop(sid, None)
            if entry is None:
                return None
            self._returning[sid] = (entry[0], now)
            while len(self._returning) > self.max_sessions:
                self._returning.popitem(last=False)
            return entry[0]

    def put(self, sid: str, visitor: Visitor) -> None:
        """Store a new visitor under ``sid``, evicting the least recently used new one beyond the cap."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            self._new[sid] = (visitor, now)
            while len(self._new) > self.max_new:
                self._new.popitem(last=False)

    def _expire(self, now: float) -> None:
        for tier in (self._new, self._returning):
            while tier and now - next(iter(tier.values()))[1] > self.idle_seconds:
                tier.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._new) + len(self._returning)


class WebShopServer(ThreadingHTTPServer):
    """The HTTP server: the shop, the goals visitors get, and their sessions.

    Args:
        address: ``(host, port)``; port 0 picks a free one (see ``server_address``).
        shop: the shared shop.
        split_indices: the goal indices new tasks are drawn from.
        upstream_quirks: passed to the reward.
        max_sessions: how many visitors are remembered.
    """

    daemon_threads = True
    #: The listen backlog (socketserver's default of 5 makes a burst of connections wait on SYN retries).
    request_queue_size = 256

    def __init__(
        self,
        address: tuple[str, int],
        shop: Shop,
        split_indices: range,
        upstream_quirks: bool = True,
        max_sessions: int = 1000,
        max_connections: int = 1024,
        idle_seconds: float = 3600.0,
    ):
        super().__init__(address, WebShopHandler)
        self.shop = shop
        self.split_indices = split_indices
        self.upstream_quirks = upstream_quirks
        self.sessions = SessionStore(max_sessions, idle_seconds=idle_seconds)
        #: At most this many connections are served at once (one thread each); beyond it a
        #: connection gets an immediate 503 instead of a thread. With the handlers' read timeout,
        #: slow or half-open clients hold a slot for seconds, not for as long as they like.
        self.max_connections = max_connections
        self._slots = threading.BoundedSemaphore(max_connections)
        self.verbose = False
        self._rng = random.Random()
        self._rng_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread per connection, up to ``max_connections``; past that, an immediate 503."""
        if not self._slots.acquire(blocking=False):
            try:
                request.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A visitor hanging up is routine; anything else is printed as usual."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        """The base URL the server listens on."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def new_session(self, position: int | None = None) -> ShopSession:
        """A session for the split's ``position``-th goal, or a random one."""
        if position is None:
            with self._rng_lock:
                position = self._rng.randrange(len(self.split_indices))
        index = self.split_indices[position]
        return ShopSession(self.shop, self.shop.goals[index], index, upstream_quirks=self.upstream_quirks)


class WebShopHandler(BaseHTTPRequestHandler):
    """Routes requests to the visitor's session and renders its page."""

    server: WebShopServer
    #: Seconds a read may wait on the client (the request line, headers, body): a half-open or
    #: slow client holds its thread this long at most.
    timeout = READ_TIMEOUT
    server_version = "envhub-webshop"
    protocol_version = "HTTP/1.1"

    # ------------------------------------------------------------------ methods

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def __getattr__(self, name: str) -> Any:
        # Any other method (PUT, DELETE, FOO, ...) is a client error, not http.server's 501.
        if name.startswith("do_"):
            return lambda: self._send_error(HTTPStatus.METHOD_NOT_ALLOWED, f"{name[3:]} is not supported; use GET or POST")
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """Quiet by default; the ``serve`` command logs requests when asked."""
        if self.server.verbose:
            super().log_message(format, *args)

    # ------------------------------------------------------------------ routing

    def _handle(self, method: str) -> None:
        try:
            path, query = self._split_url()
            routes = {("GET", "/"): self._page, ("GET", "/new"): self._new, ("POST", "/search"): self._search, ("POST", "/click"): self._click}
            handler = routes.get((method, path))
            if handler is None:
                if any(p == path for _, p in routes):
                    raise BadRequest(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} is not allowed on {path}")
                raise BadRequest(HTTPStatus.NOT_FOUND, f"there is no page {path}")
            handler(query)
        except BadRequest as exc:
            self._send_error(exc.status, str(exc))

    def _split_url(self) -> tuple[str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        try:
            query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query), errors="strict")
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"malformed query string: {exc}") from exc
        return parts.path, query

    def _visitor(self, create: bool = True) -> tuple[str, Visitor, bool]:
        sid = None
        raw = self.headers.get("Cookie")
        if raw:
            try:
                morsel = SimpleCookie(raw).get(COOKIE)
            except CookieError:
                morsel = None
            sid = morsel.value if morsel is not None else None
        visitor = self.server.sessions.get(sid)
        if visitor is not None:
            return sid, visitor, False
        if not create:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "no shopping session; open / first")
        sid = secrets.token_urlsafe(18)
        visitor = Visitor(self.server.new_session())
        self.server.sessions.put(sid, visitor)
        return sid, visitor, True

    def _form(self) -> dict[str, list[str]]:
        length = self.headers.get("Content-Length")
        if length is None:
            raise BadRequest(HTTPStatus.LENGTH_REQUIRED, "a POST needs a Content-Length")
        try:
            size = int(length)
        except ValueError:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "Content-Length is not a number") from None
        if size < 0:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "Content-Length is negative")
        if size > MAX_BODY:
            self.close_connection = True
            raise BadRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the form is larger than {MAX_BODY} bytes")
        body = self.rfile.read(size)
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            raise BadRequest(HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "send the form as application/x-www-form-urlencoded")
        try:
            return parse_qs(body.decode("utf-8"), keep_blank_values=True, strict_parsing=bool(body), errors="strict")
        except (ValueError, UnicodeDecodeError) as exc:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"malformed form: {exc}") from exc

    @staticmethod
    def _field(form: dict[str, list[str]], name: str) -> str:
        values = form.get(name)
        if not values or len(values) != 1:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"the form needs exactly one {name!r} field")
        return values[0]

    # ------------------------------------------------------------------ routes

    def _page(self, query: dict[str, list[str]]) -> None:
        if query:
            raise BadRequest(HTTPStatus.BAD_REQUEST, "/ takes no parameters")
        sid, visitor, created = self._visitor()
        with visitor.lock:
            body = render_page(visitor.session, session_code(sid))
        self._send_html(HTTPStatus.OK, body, sid if created else None)

    def _new(self, query: dict[str, list[str]]) -> None:
        position = None
        if query:
            # ASCII digits only, and few of them: str.isdigit() accepts "²", and int() refuses
            # numbers of more than 4,300 digits; both raised ValueError and got no response.
            value = query["goal"][0] if set(query) == {"goal"} and len(query["goal"]) == 1 else ""
            if not (value.isascii() and value.isdigit() and len(value) <= 18):
                raise BadRequest(HTTPStatus.BAD_REQUEST, "/new takes one parameter, goal=N (a goal number)")
            position = int(query["goal"][0])
            if position >= len(self.server.split_indices):
                raise BadRequest(HTTPStatus.NOT_FOUND, f"there are {len(self.server.split_indices)} goals (0 to {len(self.server.split_indices) - 1})")
        sid, visitor, created = self._visitor()
        with visitor.lock:
            visitor.session = self.server.new_session(position)
        self._redirect(sid if created else None)

    def _search(self, _query: dict[str, list[str]]) -> None:
        form = self._form()
        text = self._field(form, "q")
        if not text.strip():
            raise BadRequest(HTTPStatus.BAD_REQUEST, "type something to search for")
        if len(text) > MAX_QUERY or "\n" in text or "\r" in text:
            raise BadRequest(HTTPStatus.BAD_REQUEST, f"a search is one line of at most {MAX_QUERY} characters")
        sid, visitor, _ = self._visitor(create=False)
        with visitor.lock:
            if visitor.session.page == DONE:
                raise BadRequest(HTTPStatus.CONFLICT, "this task is finished; start a new one")
            visitor.session.act("search", text.lower())
        self._redirect(None)

    def _click(self, _query: dict[str, list[str]]) -> None:
        form = self._form()
        target = self._field(form, "target").lower()
        _, visitor, _ = self._visitor(create=False)
        with visitor.lock:
            session = visitor.session
            if target == "search" or target not in session.clickables():
                raise BadRequest(HTTPStatus.BAD_REQUEST, f"{target[:80]!r} is not clickable on this page")
            session.act("click", target)
        self._redirect(None)

    # ------------------------------------------------------------------ responses

    def _send_html(self, status: HTTPStatus, body: str, new_sid: str | None = None) -> None:
        data = body.encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if new_sid:
            self.send_header("Set-Cookie", f"{COOKIE}={new_sid}; Path=/; HttpOnly; SameSite=Lax")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _redirect(self, new_sid: str | None) -> None:
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", "/")
        self.send_header("Content-Length", "0")
        if new_sid:
            self.send_header("Set-Cookie", f"{COOKIE}={new_sid}; Path=/; HttpOnly; SameSite=Lax")
        self.end_headers()

    def _send_error(self, status: HTTPStatus, message: str) -> None:
        # The request body may be unread: end the connection rather than parse it as a request.
        self.close_connection = True
        body = _TEMPLATES.get_template("error.html").render(status=int(status), phrase=status.phrase, message=message)
        self._send_html(status, body)


def session_code(sid: str) -> str:
    """The completion code upstream's web app shows: SHA-1 of the session id, 10 hex digits, upper case."""
    return hashlib.sha1(sid.encode("utf-8")).hexdigest()[:10].upper()


def render_page(session: ShopSession, code: str = "") -> str:
    """The HTML of ``session``'s current page (``code`` is shown on the score page)."""
    context: dict[str, Any] = {"s": session, "instruction": session.goal.instruction_text, "page": session.page, "code": code}
    if session.page == SEARCH:
        return _TEMPLATES.get_template("search.html").render(**context)
    if session.page == RESULTS:
        items = [(asin, session.shop.catalog[asin]) for asin in session.page_hits()]
        return _TEMPLATES.get_template("results.html").render(items=items, total=len(session.hits()), **context)
    if session.page == ITEM:
        return _TEMPLATES.get_template("item.html").render(product=session.product, **context)
    if session.page in SUB_PAGES:
        return _TEMPLATES.get_template("subpage.html").render(product=session.product, **context)
    return _TEMPLATES.get_template("done.html").render(
        details=session.reward_info or {}, goal=session.goal, purchased=session.purchased, **context
    )


def make_server(
    shop: Shop,
    host: str = "127.0.0.1",
    port: int = 0,
    split_indices: range | None = None,
    upstream_quirks: bool = True,
    **limits: Any,
) -> WebShopServer:
    """Create (not start) a server for ``shop``; call ``serve_forever()`` on it, ``shutdown()`` to stop.

    ``limits``: ``max_sessions``, ``max_connections``, ``idle_seconds`` (see :class:`WebShopServer`)."""
    indices = split_indices if split_indices is not None else range(len(shop.goals))
    return WebShopServer((host, port), shop, indices, upstream_quirks, **limits)

