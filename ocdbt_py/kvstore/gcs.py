"""Google Cloud Storage (``gs://bucket/prefix``, ``gcs://...``) through gcsfs.

Conditional writes use GCS generation preconditions on a single multipart upload sent through
gcsfs's request helper: ``ifGenerationMatch=0`` creates only if absent,
``ifGenerationMatch=<generation>`` replaces only the generation that was read.  The token is
the object generation, which GCS changes on every write.  GCS answers 412 when the
precondition fails, which surfaces as :class:`~ocdbt_py.errors.ConditionFailedError`.

Configuration comes through fsspec ``storage_options`` (``token``, ``project``,
``endpoint_url``, ...) or the usual environment (``GOOGLE_APPLICATION_CREDENTIALS``,
``STORAGE_EMULATOR_HOST``; with the latter and no ``token``, requests are anonymous, as with
Google's own client).  Against an emulator (an ``endpoint_url`` or
``STORAGE_EMULATOR_HOST``) the plain :class:`gcsfs.core.GCSFileSystem` is used, because
gcsfs's experimental zonal/HNS filesystem calls control-plane APIs that emulators lack.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

from ocdbt_py.errors import ConditionFailedError, StorageError
from ocdbt_py.kvstore.object_store import ObjectStore, _secret_strings

__all__ = ["GcsStore"]

_BOUNDARY = "==ocdbt-py-boundary=="


def _multipart(name: str, data: bytes) -> bytes:
    meta = json.dumps({"name": name}).encode()
    b = _BOUNDARY.encode()
    return (
        b"--" + b + b"\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n" + meta
        + b"\r\n--" + b + b"\r\nContent-Type: application/octet-stream\r\n\r\n" + data
        + b"\r\n--" + b + b"--\r\n"
    )


class GcsStore(ObjectStore):
    """A GCS bucket (or a prefix of one) as a :class:`KvStore` with atomic conditional writes."""

    @classmethod
    def from_url(
        cls,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        read_only: bool | None = None,
    ) -> GcsStore:
        """Open ``gs://bucket/prefix``; ``storage_options`` go to :class:`gcsfs.GCSFileSystem`."""
        opts, ours = cls._split_options(storage_options)
        try:
            # optional: fsspec loads its backends on first use
            import fsspec
            import gcsfs.core
        except ImportError as e:
            raise StorageError(f"cannot open {url}: gcsfs is not installed (pip install 'ocdbt-py[gcs]')") from e
        emulator = os.environ.get("STORAGE_EMULATOR_HOST") or ""
        endpoint = opts.get("endpoint_url") or emulator
        if emulator and not opts.get("endpoint_url"):
            # as Google's own client does for STORAGE_EMULATOR_HOST: no credentials to look for
            opts.setdefault("token", "anon")
        fs_cls: Any = fsspec.get_filesystem_class("gs")
        if endpoint and fs_cls is not gcsfs.core.GCSFileSystem and issubclass(fs_cls, gcsfs.core.GCSFileSystem):
            fs_cls = gcsfs.core.GCSFileSystem  # emulators lack the zonal/HNS control plane
        try:
            fs = fs_cls(**opts)
            root = fs_cls._strip_protocol(url)
        except (ImportError, ValueError, TypeError) as e:
            raise StorageError(f"cannot open {url}: {e}") from e
        store = cls(
            fs,
            root,
            read_only=read_only,
            single_writer=bool(ours.get("single_writer", False)),
            custom_endpoint=bool(endpoint) and "storage.googleapis.com" not in str(endpoint),
            secrets=_secret_strings(storage_options or {}),
            scheme=url.split("://", 1)[0].lower(),
        )
        return store

    def _media_url(self, bucket: str, name: str) -> str:
        return f"{self.fs._location}/download/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    def _meta_url(self, bucket: str, name: str) -> str:
        return f"{self.fs._location}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    async def _get_range(self, bucket: str, name: str, start: int, stop: int | None) -> bytes | None:
        headers: dict[str, str] = {}
        if start < 0:
            headers["Range"] = f"bytes={start}"
        elif start > 0 or stop is not None:
            headers["Range"] = f"bytes={start}-" + ("" if stop is None else str(stop - 1))
        try:
            resp_headers, data = await self.fs._call("GET", self._media_url(bucket, name), alt="media", headers=headers)
        except FileNotFoundError:
            return None
        except Exception as e:
            if getattr(e, "code", None) == 416 or "416" in str(getattr(e, "message", "")):
                return b""
            raise
        data = bytes(data)
        if headers and "Content-Range" not in resp_headers:  # the server ignored the Range header
            data = data[start:] if stop is None else data[start:stop]
        return data

    async def _object_size(self, bucket: str, name: str) -> int | None:
        try:
            meta = await self.fs._call("GET", self._meta_url(bucket, name), json_out=True)
        except FileNotFoundError:
            return None
        return int(meta["size"])

    async def _read_with_generation(self, bucket: str, name: str) -> tuple[bytes | None, str | None]:
        url = self._media_url(bucket, name)
        try:
            headers, data = await self.fs._call("GET", url, alt="media")
        except FileNotFoundError:
            return None, None
        gen = headers.get("X-Goog-Generation") or headers.get("x-goog-generation")
        if gen is None:
            # servers that omit the header: pin a generation, then read exactly it
            try:
                meta = await self.fs._call("GET", self._meta_url(bucket, name), json_out=True)
                gen = str(meta["generation"])
                _, data = await self.fs._call("GET", url, alt="media", generation=gen)
            except FileNotFoundError:
                return None, None
        return bytes(data), str(gen)

    async def _upload(self, bucket: str, name: str, data: bytes, **params: str) -> str:
        url = f"{self.fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        j = await self.fs._call(
            "POST",
            url,
            uploadType="multipart",
            headers={"Content-Type": f'multipart/related; boundary="{_BOUNDARY}"'},
            data=_multipart(name, data),
            json_out=True,
            **params,
        )
        return str(j["generation"])

    async def _write_conditional(self, bucket: str, name: str, data: bytes, if_generation: str | None) -> str:
        try:
            return await self._upload(bucket, name, data, ifGenerationMatch=if_generation or "0")
        except FileExistsError as e:  # gcsfs raises this for HTTP 412
            raise ConditionFailedError("412 precondition failed") from e

    async def _write_plain(self, bucket: str, name: str, data: bytes) -> str:
        return await self._upload(bucket, name, data)
