"""Amazon S3 and S3-compatible stores (``s3://bucket/prefix``) through s3fs.

Conditional writes use S3's own preconditions on PutObject, sent through s3fs's aiobotocore
client: ``If-None-Match: *`` creates only if absent, ``If-Match: <etag>`` replaces only the
version that was read.  The generation token is the object's ETag.  S3 answers 412
PreconditionFailed when the condition does not hold and 409 ConditionalRequestConflict when
another conditional write to the key is in flight; both surface as
:class:`~ocdbt_py.errors.ConditionFailedError`, so the caller re-reads and retries.

An ETag is a hash of the content, so writing the same bytes again yields the same token.
That is harmless for OCDBT (every manifest names a new generation, so no two are alike) but
means a token identifies content, not a write.

Configuration comes through fsspec ``storage_options`` (``key``, ``secret``, ``token``,
``endpoint_url``, ``client_kwargs={"region_name": ...}``, ``profile``, ...) or the usual
``AWS_*`` environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_ENDPOINT_URL``, ``AWS_DEFAULT_REGION``, ...).

Reads (GET, HEAD, listing) of a store with static credentials and a known endpoint and region
skip botocore: we sign them (:mod:`~ocdbt_py.kvstore.s3direct`), so a restore's first request
does not wait for botocore to build its client.  Anything else goes through s3fs.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from typing import Any

from ocdbt_py.errors import ConditionFailedError, StorageError, UnsupportedError
from ocdbt_py.kvstore.direct import TRANSIENT, DirectReadStore, reader_for
from ocdbt_py.kvstore.object_store import _secret_strings
from ocdbt_py.kvstore.rangeio import HttpStatusError, TlsVerifyError
from ocdbt_py.kvstore.s3direct import S3Direct

__all__ = ["S3Store"]

_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey", "412", "409"}
_UNSUPPORTED_CODES = {"NotImplemented", "501"}


def _error_code(exc: BaseException) -> tuple[str | None, int | None]:
    """The S3 error code and HTTP status behind an s3fs exception (or its cause)."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            break
        resp = getattr(seen, "response", None)
        if isinstance(resp, dict):
            code = (resp.get("Error") or {}).get("Code")
            status = (resp.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            return (str(code) if code is not None else None), status
        seen = seen.__cause__ or seen.__context__
    return None, None


def _is_aws_endpoint(url: str) -> bool:
    return ".amazonaws.com" in url or ".amazonaws.com.cn" in url


class S3Store(DirectReadStore):
    """An S3 bucket (or a prefix of one) as a :class:`KvStore` with atomic conditional writes."""

    @classmethod
    def from_url(
        cls,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        read_only: bool | None = None,
    ) -> S3Store:
        """Open ``s3://bucket/prefix``; ``storage_options`` go to :class:`s3fs.S3FileSystem`."""
        opts, ours = cls._split_options(storage_options)
        try:
            # optional: fsspec loads its backends on first use
            import fsspec.core
            import s3fs  # noqa: F401
        except ImportError as e:
            raise StorageError(f"cannot open {url}: s3fs is not installed (pip install s3fs)") from e
        # botocore keeps 10 connections by default: too few for batch reads over latency
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", cls.max_concurrency)
        opts["config_kwargs"] = config
        try:
            fs, root = fsspec.core.url_to_fs(url, **opts)
        except (ImportError, ValueError, TypeError) as e:
            raise StorageError(f"cannot open {url}: {e}") from e
        direct = S3Direct.from_options(opts, reader_for)
        endpoint = (
            opts.get("endpoint_url")
            or (opts.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or ""
        )
        store = cls(
            fs,
            root,
            read_only=read_only,
            single_writer=bool(ours.get("single_writer", False)),
            custom_endpoint=bool(endpoint) and not _is_aws_endpoint(str(endpoint)),
            secrets=_secret_strings(storage_options or {}),
            scheme=url.split("://", 1)[0].lower(),
        )
        store._direct = direct
        return store


    async def _get_range(self, bucket: str, name: str, start: int, stop: int | None) -> bytes | None:
        answered, got = await self._direct_get(bucket, name, start, stop)
        if answered:
            return got
        kw: dict[str, str] = {}
        if start < 0:
            kw["Range"] = f"bytes={start}"
        elif start > 0 or stop is not None:
            kw["Range"] = f"bytes={start}-" + ("" if stop is None else str(stop - 1))
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=name, **kw)
        except FileNotFoundError:
            return None
        except Exception as e:
            code, status = _error_code(e)
            if code == "InvalidRange" or status == 416:
                return b""  # the range starts at or past the end (or the object is empty)
            raise
        body = resp["Body"]
        try:
            return bytes(await body.read())
        finally:
            body.close()

    async def _read_into_async(self, key: str, start: int, buf: memoryview) -> int | None:
        """One ranged GET whose body is streamed into ``buf`` (no intermediate join)."""
        bucket, name = self._locate(key)
        n = len(buf)
        if n == 0:
            return 0
        try:
            try:
                resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=name,
                                              Range=f"bytes={start}-{start + n - 1}", **self.fs.req_kw)
            except FileNotFoundError:
                return None
            except Exception as e:
                code, status = _error_code(e)
                if code == "InvalidRange" or status == 416:
                    return 0
                raise
            body = resp["Body"]
            got = 0
            try:
                while got < n:
                    k = await body.readinto(buf[got:])
                    if not k:
                        break
                    got += k
            finally:
                body.close()
            return got
        except Exception as e:
            raise self._fail("reading", key, e) from e

    # -- threaded range reads (see ocdbt_py.kvstore.rangeio) ---------------------------------------
    #: presigned GET URLs live this long; they are reused for half of it
    _presign_seconds = 3600

    def _threaded_reader(self) -> Any:
        """The threaded HTTP reader for this store, or ``None`` where it cannot stand in for
        the S3 client (proxies, extra request parameters such as SSE-C keys, or
        ``OCDBT_PY_THREADED_HTTP=0``)."""
        state = getattr(self, "_http_state", None)
        if state is not None:
            return state or None
        self._presigned: dict[str, tuple[str, float]] = {}
        if self._direct is not None:
            self._http_state: Any = self._direct.reader
            return self._direct.reader
        reader: Any = False
        env = os.environ
        fs = self.fs
        client_kwargs = getattr(fs, "client_kwargs", None) or {}
        config_kwargs = getattr(fs, "config_kwargs", None) or {}
        if (env.get("OCDBT_PY_THREADED_HTTP", "1") not in ("0", "false", "no")
                and not any(env.get(v) for v in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                                                "ALL_PROXY", "all_proxy"))
                and not config_kwargs.get("proxies")
                and not getattr(fs, "s3_additional_kwargs", None)):
            verify = client_kwargs.get("verify", env.get("AWS_CA_BUNDLE") or None)
            if verify is None or isinstance(verify, (bool, str)):
                reader = reader_for(verify)
        self._http_state = reader
        return reader or None

    def _presign(self, keys: Sequence[str]) -> dict[str, str]:
        """Presigned GET URLs for ``keys`` (cached; all uncached ones signed in one loop call)."""
        now = time.monotonic()
        out: dict[str, str] = {}
        todo: list[str] = []
        for k in dict.fromkeys(keys):
            hit = self._presigned.get(k)
            if hit is not None and hit[1] > now:
                out[k] = hit[0]
            else:
                todo.append(k)
        direct = self._direct
        if todo and isinstance(direct, S3Direct):
            for k in todo:
                b, n = self._locate(k)
                out[k] = direct.presign(b, n, self._presign_seconds)
                self._presigned[k] = (out[k], now + self._presign_seconds / 2)
            todo = []
        if todo:
            async def sign() -> list[str]:
                client = await self.fs.set_session()
                return list(await asyncio.gather(*(
                    client.generate_presigned_url(
                        "get_object", Params={"Bucket": b, "Key": n, **self.fs.req_kw},
                        ExpiresIn=self._presign_seconds)
                    for b, n in (self._locate(k) for k in todo))))

            urls = self._run(sign())
            for k, u in zip(todo, urls):
                out[k] = u
                self._presigned[k] = (u, now + self._presign_seconds / 2)
        return out

    def read_into(self, requests: Sequence[tuple[str, int, memoryview]]) -> list[Any]:
        reader = self._threaded_reader()
        if reader is None:
            return super().read_into(requests)
        for key, start, _ in requests:
            self._locate(key)
            if start < 0:
                raise ValueError("read_into needs a non-negative start")
        try:
            urls = self._presign([k for k, _, _ in requests])
        except Exception:  # noqa: BLE001 - cannot presign here: use the S3 client itself
            self._http_state = False
            return super().read_into(requests)
        return [reader.run(self._fast_read, reader, urls[k], k, start, buf) for k, start, buf in requests]

    def _fast_read(self, reader: Any, url: str, key: str, start: int, buf: memoryview) -> int | None:
        if self._http_state is False:  # an earlier request found the fast path unusable
            return self._run(self._read_into_async(key, start, buf))
        try:
            return reader.read_into(url, start, buf)  # type: ignore[no-any-return]
        except HttpStatusError as e:
            if e.status in (200, 301, 307, 400, 403):
                # redirected, refused the presigned form, or ignored the range: the S3 client
                # knows better (regions, signing); stop using the fast path for this store
                self._http_state = False
                self._direct_failed()
                return self._run(self._read_into_async(key, start, buf))
            raise self._fail("reading", key, e) from e
        except TlsVerifyError as e:
            raise self._fail("reading", key, e) from e
        except TRANSIENT:  # refused, reset, cut short, timed out: once more through s3fs (it retries)
            return self._run(self._read_into_async(key, start, buf))

    async def _object_size(self, bucket: str, name: str) -> int | None:
        answered, size = await self._direct_size(bucket, name)
        if answered:
            return size
        try:
            resp = await self.fs._call_s3("head_object", Bucket=bucket, Key=name)
        except FileNotFoundError:
            return None
        return int(resp["ContentLength"])

    async def _read_with_generation(self, bucket: str, name: str) -> tuple[bytes | None, str | None]:
        try:
            resp = await self.fs._call_s3("get_object", Bucket=bucket, Key=name)
        except FileNotFoundError:
            return None, None
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data), str(resp["ETag"])

    async def _write_conditional(self, bucket: str, name: str, data: bytes, if_generation: str | None) -> str:
        cond = {"IfNoneMatch": "*"} if if_generation is None else {"IfMatch": if_generation}
        try:
            resp = await self.fs._call_s3("put_object", Bucket=bucket, Key=name, Body=data, **cond)
        except (FileExistsError, FileNotFoundError) as e:
            raise ConditionFailedError(str(e)) from e
        except Exception as e:
            code, status = _error_code(e)
            if code in _CONFLICT_CODES or status in (409, 412):
                raise ConditionFailedError(f"{code or status}") from e
            if code in _UNSUPPORTED_CODES or status == 501:
                raise UnsupportedError("the server does not implement conditional PutObject") from e
            raise
        return str(resp["ETag"])

    async def _write_plain(self, bucket: str, name: str, data: bytes) -> str:
        resp = await self.fs._call_s3("put_object", Bucket=bucket, Key=name, Body=data)
        return str(resp["ETag"])
