"""Large plain-HTTP bodies received by one blocking ``recv(MSG_WAITALL)`` (``rangeio``): the
same bytes as ``http.client``'s path, the kept-alive connection reused afterwards, and a
server that stops sending or closes early never hangs the reader or passes for a full read."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from ocdbt_py.kvstore import rangeio
from ocdbt_py.kvstore.rangeio import WAITALL_MIN, HttpRangeReader

BLOB = np.random.default_rng(7).integers(0, 256, size=6 * WAITALL_MIN + 12345, dtype=np.uint8).tobytes()
_RANGE = re.compile(rb"Range: bytes=(\d+)-(\d+)", re.I)


class _Server:
    """HTTP/1.1 on 127.0.0.1 serving ``BLOB`` by range on kept-alive connections.  ``mode``:
    ``ok``; ``stall`` (headers and half the body, then silence); ``short`` (half, then close)."""

    def __init__(self, mode: str = "ok"):
        self.mode = mode
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        with c:
            data = b""
            while not self._stop.is_set():
                while b"\r\n\r\n" not in data:
                    part = c.recv(65536)
                    if not part:
                        return
                    data += part
                head, _, data = data.partition(b"\r\n\r\n")
                m = _RANGE.search(head)
                a, b = (int(m.group(1)), int(m.group(2)) + 1) if m else (0, len(BLOB))
                body = BLOB[a:b]
                c.sendall(b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n\r\n" % len(body))
                if self.mode == "ok":
                    c.sendall(body)
                    continue
                c.sendall(body[: len(body) // 2])
                if self.mode == "short":
                    return
                self._stop.wait(30)
                return

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/blob"

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[_Server]:
    srv = _Server(getattr(request, "param", "ok"))
    yield srv
    srv.close()


def test_large_ranges_arrive_whole_on_one_connection(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = rangeio._recv_waitall

    def counting(*a: object) -> int:
        got = real(*a)  # type: ignore[arg-type]
        calls.append(got)
        return got

    monkeypatch.setattr(rangeio, "_recv_waitall", counting)
    reader = HttpRangeReader(1)
    try:
        for start, n in [(0, 3 * WAITALL_MIN), (17, 2 * WAITALL_MIN + 5), (len(BLOB) - WAITALL_MIN - 2,
                                                                             WAITALL_MIN + 2), (5, 100)]:
            buf = memoryview(bytearray(n))
            assert reader.read_into(server.url, start, buf) == n
            assert bytes(buf) == BLOB[start: start + n]
        # past the end: the server sends what there is; the reader reports it
        buf = memoryview(bytearray(2 * WAITALL_MIN))
        assert reader.read_into(server.url, len(BLOB) - WAITALL_MIN - 7, buf) == WAITALL_MIN + 7
        assert bytes(buf[: WAITALL_MIN + 7]) == BLOB[-WAITALL_MIN - 7:]
    finally:
        reader.close()
    assert server.connections == 1  # kept alive across every read
    if rangeio._WAITALL:
        assert [c > 0 for c in calls] == [True, True, True, False, True]


@pytest.mark.parametrize("server", ["short"], indirect=True)
def test_a_body_cut_short_reads_as_short(server: _Server) -> None:
    reader = HttpRangeReader(1)
    try:
        buf = memoryview(bytearray(4 * WAITALL_MIN))
        got = reader.read_into(server.url, 0, buf)
        assert got is not None and got < len(buf)  # the store reports truncation, never a full read
        assert bytes(buf[:got]) == BLOB[:got]
    finally:
        reader.close()


@pytest.mark.parametrize("server", ["stall"], indirect=True)
def test_a_stalled_body_times_out(server: _Server) -> None:
    reader = HttpRangeReader(1, timeout=1.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(OSError):  # TimeoutError: the stores' transient-error handling
            reader.read_into(server.url, 0, memoryview(bytearray(4 * WAITALL_MIN)))
        assert time.monotonic() - t0 < 10
    finally:
        reader.close()
