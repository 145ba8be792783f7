"""Ranged HTTP GETs read straight into caller-supplied buffers, on a pool of threads.

fsspec's object-store clients (aiohttp under s3fs) receive every response on one event-loop
thread, in Python: each body arrives as many small ``bytes`` objects that are then joined into
a fresh buffer, so pulling a gigabyte costs seconds of single-threaded copying and page
faults.  :class:`HttpRangeReader` instead sends each ranged GET from a worker thread over a
kept-alive :mod:`http.client` connection and ``readinto``\\ s the body directly into a buffer
the caller owns (and usually reuses): the socket reads release the GIL, nothing is joined, and
nothing is allocated per request.

The caller supplies a complete URL (for S3, a presigned one) and any headers; the reader adds
``Range``.  It never logs or echoes URLs (they carry signatures).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import socket
import ssl
import struct
import sys
import threading
import urllib.parse
from typing import Any

from ocdbt_py.pools import dedicated

__all__ = ["HttpRangeReader", "HttpStatusError", "TlsVerifyError", "shared_reader"]

#: Bytes kept from an error response's body (for the message).
_ERROR_BODY = 2048
#: Plain-HTTP bodies of at least this many bytes are received by one blocking
#: ``recv(MSG_WAITALL)`` (see :func:`_recv_waitall`).
WAITALL_MIN = 1 << 20
#: Linux only: elsewhere ``MSG_WAITALL`` on these sockets has other semantics or none.
_WAITALL = sys.platform.startswith("linux") and hasattr(socket, "MSG_WAITALL") and hasattr(socket, "SO_RCVTIMEO")


def _recv_waitall(conn: http.client.HTTPConnection, resp: http.client.HTTPResponse, buf: memoryview,
                  timeout: float) -> int:
    """Receive all but the last byte of a plain-HTTP body of known length into ``buf`` with one
    blocking ``recv(MSG_WAITALL)``; returns the bytes received (0: not applicable).

    ``http.client`` receives a body in as many ``recv`` calls as the socket has data ready
    (tens of KiB each on loopback), re-taking the GIL after each: while another thread holds
    the GIL (a restore parsing metadata, a decode job between codec calls) every one of them
    waits, and a 32 MiB range costs hundreds of such waits and syscalls.  ``MSG_WAITALL`` on a
    blocking socket returns only when the whole range has arrived, the GIL released throughout;
    ``SO_RCVTIMEO`` bounds each call by the reader's timeout.  The bytes ``http.client`` had
    already buffered are taken first, and the last byte is left to it, so it closes the response
    (and keeps the connection) as usual.  TLS sockets and chunked bodies keep ``http.client``'s path.
    """
    sock = conn.sock
    length = resp.length
    if not _WAITALL or type(sock) is not socket.socket or resp.chunked or length is None:
        return 0
    want = min(len(buf), length) - 1
    if want < WAITALL_MIN:
        return 0
    got = 0
    ready = len(resp.peek(1))  # bytes http.client's buffer holds past the headers
    if ready:
        got = resp.readinto(buf[: min(ready, want)])
    old = sock.gettimeout()
    sock.settimeout(None)
    sec = int(timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", sec, int((timeout - sec) * 1e6)))
    try:
        while got < want:
            try:
                k = sock.recv_into(buf[got:want], want - got, socket.MSG_WAITALL)
            except BlockingIOError as e:  # SO_RCVTIMEO expired with nothing received
                raise TimeoutError("timed out receiving a response body") from e
            if not k:
                break  # the server closed early: the caller's reads see the end of the body
            got += k
            resp.length -= k  # type: ignore[operator]
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
        sock.settimeout(old)
    return got


class TlsVerifyError(Exception):
    """The server's TLS certificate did not verify (not a transient failure: never retried)."""


class HttpStatusError(Exception):
    """The server answered a ranged GET with an unexpected status."""

    def __init__(self, status: int, reason: str, body: bytes):
        super().__init__(f"HTTP {status} {reason}: {body[:300]!r}")
        self.status = status
        self.body = body


class HttpRangeReader:
    """Issues ranged GETs on ``threads`` worker threads, each body read into a given buffer.

    Every thread keeps one connection per (scheme, host, port) alive between requests.
    ``verify`` sets TLS verification for ``https`` URLs: ``None``/``True`` the system's CA
    store, ``False`` none, a path that CA bundle.
    """

    def __init__(self, threads: int = 16, *, verify: bool | str | None = None, timeout: float = 120.0):
        if threads < 1:
            raise ValueError("threads must be >= 1")
        self.threads = threads
        self.timeout = timeout
        self._verify = verify
        self._ssl: ssl.SSLContext | None = None
        self._ssl_lock = threading.Lock()
        self._pool = dedicated("http", threads)
        self._local = threading.local()

    def _ssl_context(self) -> ssl.SSLContext:
        """Built on first ``https`` use (loading the CA store takes tens of milliseconds)."""
        with self._ssl_lock:
            if self._ssl is None:
                if self._verify is False:
                    self._ssl = ssl._create_unverified_context()  # noqa: S323 - the user asked for verify=False
                elif isinstance(self._verify, str):
                    self._ssl = ssl.create_default_context(cafile=self._verify)
                else:
                    self._ssl = ssl.create_default_context()
            return self._ssl

    def submit(self, url: str, start: int, buf: memoryview, headers: dict[str, str] | None = None
               ) -> concurrent.futures.Future[int | None]:
        """Read ``len(buf)`` bytes of ``url`` from offset ``start`` into ``buf``.

        The future gives the number of bytes read (fewer only when the object ends first;
        0 when ``start`` is at or past its end) or ``None`` when the object does not exist.
        """
        return self._pool.submit(self.read_into, url, start, buf, headers)

    def run(self, fn: Any, *args: Any) -> concurrent.futures.Future[Any]:
        """Run ``fn(*args)`` on one of the reader's threads (it may call :meth:`read_into`)."""
        return self._pool.submit(fn, *args)

    def _conn(self, scheme: str, host: str, port: int | None, fresh: bool) -> http.client.HTTPConnection:
        conns: dict[tuple[str, str, int | None], http.client.HTTPConnection] | None
        conns = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        key = (scheme, host, port)
        c = conns.get(key)
        if c is not None and fresh:
            c.close()
            c = None
        if c is None:
            if scheme == "https":
                ctx = self._ssl_context()
                c = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=ctx)
            elif scheme == "http":
                c = http.client.HTTPConnection(host, port, timeout=self.timeout)
            else:
                raise ValueError(f"unsupported URL scheme {scheme!r}")
            conns[key] = c
        return c

    def _send(self, method: str, url: str, headers: dict[str, str]) -> tuple[http.client.HTTPConnection,
                                                                            http.client.HTTPResponse]:
        """Send one request on this thread's kept-alive connection (retried once on a fresh
        connection when the server had closed the old one) and return its response."""
        u = urllib.parse.urlsplit(url)
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        for attempt in (0, 1):
            conn = self._conn(u.scheme, u.hostname or "", u.port, fresh=attempt > 0)
            try:
                conn.request(method, target, headers=headers)
                return conn, conn.getresponse()
            except ssl.SSLCertVerificationError as e:
                conn.close()
                raise TlsVerifyError(f"TLS certificate of {u.hostname} did not verify: {e.verify_message}") from e
            except (ConnectionError, http.client.RemoteDisconnected, http.client.CannotSendRequest,
                    http.client.ResponseNotReady, TimeoutError):
                conn.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def read_into(self, url: str, start: int, buf: memoryview, headers: dict[str, str] | None = None) -> int | None:
        """Synchronous :meth:`submit` (runs on the calling thread)."""
        n = len(buf)
        if n == 0:
            return 0
        hdrs = dict(headers or {})
        hdrs["Range"] = f"bytes={start}-{start + n - 1}"
        conn, resp = self._send("GET", url, hdrs)
        try:
            return self._body(resp, start, buf, conn, self.timeout)
        except BaseException:
            conn.close()
            raise

    def request(self, method: str, url: str, headers: dict[str, str] | None = None, *,
                max_body: int) -> tuple[int, dict[str, str], bytes]:
        """One request on the calling thread: ``(status, headers with lower-case names, body)``.

        A body longer than ``max_body`` bytes (declared or received) raises
        :class:`HttpStatusError` with status 0 instead of being read."""
        conn, resp = self._send(method, url, dict(headers or {}))
        try:
            hdrs = {k.lower(): v for k, v in resp.getheaders()}
            if method == "HEAD":  # no body, whatever Content-Length says
                return resp.status, hdrs, b""
            declared = hdrs.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > max_body):
                raise HttpStatusError(0, f"response body of {declared} bytes exceeds {max_body}", b"")
            if declared is not None:
                return resp.status, hdrs, resp.read()  # exactly the declared length
            parts: list[bytes] = []  # chunked or until close: in pieces, checked as they come
            got = 0
            while True:
                part = resp.read(min(1 << 20, max_body + 1 - got))
                if not part:
                    return resp.status, hdrs, b"".join(parts)
                got += len(part)
                if got > max_body:
                    raise HttpStatusError(0, f"response body exceeds {max_body} bytes", b"")
                parts.append(part)
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def _body(resp: http.client.HTTPResponse, start: int, buf: memoryview,
              conn: http.client.HTTPConnection | None = None, timeout: float = 120.0) -> int | None:
        status = resp.status
        if status == 404:
            resp.read()
            return None
        if status == 416:  # the range starts at or past the end (or the object is empty)
            resp.read()
            return 0
        if status == 200 and start != 0:
            # the server ignored the range: its body starts at offset 0, not ``start``
            resp.close()
            raise HttpStatusError(status, "range ignored by the server", b"")
        if status not in (200, 206):
            body = resp.read(_ERROR_BODY)
            resp.close()
            raise HttpStatusError(status, resp.reason, body)
        n = len(buf)
        got = 0 if conn is None else _recv_waitall(conn, resp, buf, timeout)
        while got < n:
            k = resp.readinto(buf[got:])
            if not k:
                break
            got += k
        if got == n and not resp.isclosed():
            # a 200 for a whole object larger than the buffer: drop the rest of the body
            rest: Any = resp.read(1)
            if rest:
                resp.close()
                raise HttpStatusError(status, "response longer than the requested range", b"")
        return got

    def close(self) -> None:
        """Stop the threads (connections close with them)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


_shared: dict[Any, HttpRangeReader] = {}
_shared_lock = threading.Lock()


def shared_reader(verify: bool | str | None = None, threads: int = 16) -> HttpRangeReader:
    """The process-wide reader for TLS setting ``verify`` (``None``/``True``: the system's
    verified context; ``False``: no verification; a path: that CA bundle)."""
    key = (verify, threads)
    with _shared_lock:
        r = _shared.get(key)
        if r is None:
            r = _shared[key] = HttpRangeReader(threads, verify=verify)
        return r
