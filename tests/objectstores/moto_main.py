"""Run moto's S3 server on 127.0.0.1 with atomic conditional writes; prints ``PORT <n>``.

Started as a subprocess by :mod:`tests.objectstores.servers`:
``python -m tests.objectstores.moto_main [--fast-ranges]``.

moto checks ``If-Match`` / ``If-None-Match`` on PutObject and then stores the object in a
separate step, with no lock between the two, while its server handles requests on many
threads.  Two racing conditional puts can then both succeed, which real S3 never allows, so
this launcher serializes mutating requests (PUT, POST, DELETE) with one lock.  Reads stay
concurrent.  Binding port 0 and printing the port the OS chose avoids any free-port race.

``--tls CERT KEY`` serves HTTPS with that certificate (TLS tests of the clients).

``--fast-ranges`` (used by the benchmarks) makes a ranged GET cost what it costs on S3: moto
copies the *whole* object out of its buffer, under a per-object lock, for every ranged GET and
then slices it, so a client that reads a 100 MiB data file in 25 ranges pays for 2.5 GB of
copies, serialized.  With the flag only the requested bytes are read.  Moto's own range
parsing, status codes and headers are unchanged.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

_MUTATING = {"PUT", "POST", "DELETE"}


class SerializeWrites:
    """WSGI middleware: mutating requests run one at a time (body read and reply included)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in _MUTATING:
            return self.app(environ, start_response)
        with self.lock:
            return list(self.app(environ, start_response))


class _RangeView:
    """Stands in for a key's value during a ranged GET: slicing reads only that range."""

    def __init__(self, key: Any):
        self.key = key

    def __len__(self) -> int:
        return int(self.key.contentsize)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, sl: slice) -> bytes:
        start, stop, _ = sl.indices(len(self))
        with self.key.lock:
            buf = self.key._value_buffer
            buf.seek(start)
            return bytes(buf.read(max(0, stop - start)))


def install_fast_ranges() -> None:
    """Patch moto so a ranged GET reads only the requested bytes (see the module docstring)."""
    from moto.s3.models import FakeKey
    from moto.s3.responses import S3Response

    state = threading.local()
    value_prop = FakeKey.value

    def value_get(self: Any) -> Any:
        if getattr(state, "ranged", False):
            return _RangeView(self)
        return value_prop.fget(self)  # type: ignore[attr-defined]

    FakeKey.value = property(value_get, value_prop.fset)  # type: ignore[assignment, attr-defined]
    key_response = S3Response.key_response

    def patched(self: Any, request: Any, full_url: str, headers: Any) -> Any:
        state.ranged = request.method == "GET" and bool(request.headers.get("range"))
        try:
            status, out_headers, body = key_response(self, request, full_url, headers)
        finally:
            state.ranged = False
        if isinstance(body, _RangeView):  # not sliced after all (moto fell back to 200)
            body = body[0 : len(body)]
        return status, out_headers, body

    S3Response.key_response = patched  # type: ignore[method-assign]


def main() -> None:
    """Serve until killed."""
    if "--fast-ranges" in sys.argv[1:]:
        install_fast_ranges()
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    app = SerializeWrites(DomainDispatcherApplication(create_backend_app))
    ssl_context: Any = None
    if "--tls" in sys.argv[1:]:  # --tls CERT KEY: serve HTTPS with that certificate
        i = sys.argv.index("--tls")
        ssl_context = (sys.argv[i + 1], sys.argv[i + 2])
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler,
                         ssl_context=ssl_context)
    print(f"PORT {server.server_address[1]}", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
