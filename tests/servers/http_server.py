"""A real HTTP file server on 127.0.0.1 with byte-range support, for read-only backend tests."""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import re
import threading
from collections.abc import Iterator

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


class RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Static files plus ``Range: bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` (206 responses)."""

    requests_seen = 0

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        type(self).requests_seen += 1
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if os.path.isdir(path) and not self.path.split("?", 1)[0].endswith("/"):
            # like an object store: "dir" (no slash) names no object
            self.send_error(404, "not an object")
            return None
        if rng is None or os.path.isdir(path):
            return super().send_head()
        m = _RANGE.match(rng.strip())
        if not m or not os.path.isfile(path):
            return super().send_head()
        size = os.path.getsize(path)
        a, b = m.groups()
        if a == "":
            start, end = max(size - int(b), 0), size - 1
        else:
            start = int(a)
            end = size - 1 if b == "" else min(int(b), size - 1)
        if start >= size:
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        f = open(path, "rb")  # noqa: SIM115 - closed by the base class
        f.seek(start)
        data = f.read(end - start + 1)
        f.close()
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        import io

        return io.BytesIO(data)


@contextlib.contextmanager
def serve_directory(root: str) -> Iterator[str]:
    """Serve ``root`` over HTTP on a free loopback port; yields the base URL."""
    handler = functools.partial(RangeHandler, directory=root)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
