"""An HTTP reverse proxy on 127.0.0.1 that delays every request and counts them.

Put it in front of an object-store server to model network latency for *any* client (s3fs,
TensorStore's own S3 driver, ...)::

    python -m tests.objectstores.latency_proxy --upstream http://127.0.0.1:PORT --delay 0.02

prints ``PORT <n>`` once it listens.  ``GET /__proxy__/stats`` returns JSON counters and
``POST /__proxy__/reset`` zeroes them.  ``depth`` is the longest chain of requests in which
each arrived only after the previous one had been answered: an upper bound on the round trips
a client made in sequence (see :mod:`ocdbt_py.testing.latency`).

Use :func:`start_proxy` from tests; it runs the proxy as a child process so it never competes
with the client under test for the GIL.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import time
import urllib.request
from typing import Any

_HOP = {
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
    "transfer-encoding", "upgrade", "content-length",
}


class Counters:
    """Request counters with the causal-depth rule."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Zero everything."""
        self.requests = 0
        self.by_method: dict[str, int] = {}
        self.bytes_out = 0
        self.depth = 0
        self.finished_depth = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def begin(self, method: str) -> int:
        """Count a request arriving; returns its depth."""
        self.requests += 1
        self.by_method[method] = self.by_method.get(method, 0) + 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return self.finished_depth + 1

    def end(self, depth: int, nbytes: int) -> None:
        """Count a request answered."""
        self.in_flight -= 1
        self.bytes_out += nbytes
        self.finished_depth = max(self.finished_depth, depth)
        self.depth = max(self.depth, depth)

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly snapshot."""
        return {
            "requests": self.requests,
            "by_method": dict(self.by_method),
            "bytes_out": self.bytes_out,
            "depth": self.depth,
            "max_in_flight": self.max_in_flight,
        }


async def serve(upstream: str, delay: float) -> None:
    """Run the proxy until cancelled."""
    import aiohttp
    from aiohttp import web

    counters = Counters()
    session = aiohttp.ClientSession(
        auto_decompress=False,
        connector=aiohttp.TCPConnector(limit=0, force_close=False),
        timeout=aiohttp.ClientTimeout(total=600),
    )

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path == "/__proxy__/stats":
            return web.json_response(counters.as_dict())
        if request.path == "/__proxy__/reset":
            counters.reset()
            return web.json_response({"ok": True})
        depth = counters.begin(request.method)
        nbytes = 0
        try:
            if delay:
                await asyncio.sleep(delay)
            body = await request.read()
            headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
            async with session.request(
                request.method, upstream + request.raw_path, headers=headers, data=body or None,
                allow_redirects=False,
            ) as r:
                out_headers = {k: v for k, v in r.headers.items() if k.lower() not in _HOP}
                length = r.headers.get("Content-Length")
                if request.method == "HEAD" or length is None:
                    content = await r.read()
                    nbytes = len(content)
                    if request.method == "HEAD" and length is not None:
                        out_headers["Content-Length"] = length
                    return web.Response(status=r.status, body=content or None, headers=out_headers)
                # stream the body through: a large response is not held back until complete
                resp = web.StreamResponse(status=r.status, headers=out_headers)
                resp.content_length = int(length)
                await resp.prepare(request)
                async for chunk in r.content.iter_chunked(1 << 20):
                    nbytes += len(chunk)
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        finally:
            counters.end(depth, nbytes)

    app = web.Application(client_max_size=1 << 31)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"PORT {port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await session.close()
        await runner.cleanup()


class ProxyHandle:
    """A running proxy child process."""

    def __init__(self, proc: Any, endpoint: str):
        self.proc = proc
        self.endpoint = endpoint

    def stats(self) -> dict[str, Any]:
        """The counters so far."""
        with urllib.request.urlopen(f"{self.endpoint}/__proxy__/stats", timeout=10) as r:
            return json.loads(r.read())  # type: ignore[no-any-return]

    def reset(self) -> None:
        """Zero the counters."""
        req = urllib.request.Request(f"{self.endpoint}/__proxy__/reset", data=b"", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stop(self) -> None:
        """Stop the proxy."""
        self.proc.stop()


def start_proxy(upstream: str, delay: float) -> ProxyHandle:
    """Start a proxy to ``upstream`` adding ``delay`` seconds per request."""
    from tests.objectstores.servers import REPO, START_TIMEOUT, ServerProcess

    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = ServerProcess(
        "latency-proxy",
        [sys.executable, "-m", "tests.objectstores.latency_proxy", "--upstream", upstream, "--delay", str(delay)],
        cwd=str(REPO),
        env=env,
    )
    m = proc.wait_for_line(re.compile(r"^PORT (\d+)$"), time.monotonic() + START_TIMEOUT)
    return ProxyHandle(proc, f"http://127.0.0.1:{m.group(1)}")


def main() -> None:
    """Command line entry point."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--delay", type=float, default=0.0)
    args = ap.parse_args()
    try:
        asyncio.run(serve(args.upstream.rstrip("/"), args.delay))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
