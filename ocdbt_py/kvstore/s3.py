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

This is the fsspec route of ``s3://`` URLs: users without obstore, or options obstore cannot
take (:mod:`~ocdbt_py.kvstore.obstore_store` is the route otherwise).
"""

from __future__ import annotations

import os
from typing import Any

from ocdbt_py.errors import ConditionFailedError, StorageError, UnsupportedError
from ocdbt_py.kvstore.object_store import ObjectStore, _secret_strings

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


class S3Store(ObjectStore):
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
            raise StorageError(f"cannot open {url}: s3fs is not installed (pip install 'ocdbt-py[s3]')") from e
        # botocore keeps 10 connections by default: too few for batch reads over latency
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("max_pool_connections", cls.max_concurrency)
        opts["config_kwargs"] = config
        try:
            fs, root = fsspec.core.url_to_fs(url, **opts)
        except (ImportError, ValueError, TypeError) as e:
            raise StorageError(f"cannot open {url}: {e}") from e
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
        return store

    async def _get_range(self, bucket: str, name: str, start: int, stop: int | None) -> bytes | None:
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

    async def _object_size(self, bucket: str, name: str) -> int | None:
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
