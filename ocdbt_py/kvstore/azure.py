"""Azure Blob Storage (``az://container/prefix``, ``abfs://``, ``abfss://``) through adlfs.

Conditional writes use Azure's ETag preconditions on Put Blob, sent through the async
``BlobServiceClient`` that adlfs holds (``fs.service_client``): ``If-None-Match: *`` creates
only if absent, ``If-Match: <etag>`` replaces only the version that was read.  Azure changes
a blob's ETag on every write.  It answers 409 BlobAlreadyExists or 412 ConditionNotMet when
the condition fails; both surface as :class:`~ocdbt_py.errors.ConditionFailedError`.

Configuration comes through fsspec ``storage_options`` (``account_name``, ``account_key``,
``sas_token``, ``connection_string``, ``credential``, ``anon``, ...) or adlfs's environment
variables (``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_NAME``,
``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``, service-principal variables).

``adl://`` names the retired Data Lake Gen1 service and is not handled here.
"""

from __future__ import annotations

import os
from typing import Any

from ocdbt_py.errors import ConditionFailedError, StorageError
from ocdbt_py.kvstore.credentials import credentials_hint
from ocdbt_py.kvstore.object_store import ObjectStore, _secret_strings, redact

__all__ = ["AzureStore"]


def _endpoint_of(opts: dict[str, Any]) -> str:
    conn = opts.get("connection_string") or os.environ.get("AZURE_STORAGE_CONNECTION_STRING") or ""
    for part in str(conn).split(";"):
        k, _, v = part.partition("=")
        if k.strip().lower() == "blobendpoint":
            return v.strip()
    if "UseDevelopmentStorage=true" in str(conn):
        return "http://127.0.0.1:10000"
    return str(opts.get("account_host") or "")


class AzureStore(ObjectStore):
    """An Azure Blob container (or a prefix of one) as a :class:`KvStore` with atomic
    conditional writes."""

    bucket_word = "container"

    @classmethod
    def from_url(
        cls,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        read_only: bool | None = None,
    ) -> AzureStore:
        """Open ``az://container/prefix``; ``storage_options`` go to adlfs."""
        opts, ours = cls._split_options(storage_options)
        try:
            import adlfs  # noqa: F401
            import fsspec.core
        except ImportError as e:
            raise StorageError(f"cannot open {url}: adlfs is not installed (pip install 'ocdbt-py[azure]')") from e
        try:
            fs, root = fsspec.core.url_to_fs(url, **opts)
        except (ImportError, ValueError, TypeError) as e:
            raise StorageError(f"cannot open {url}: {credentials_hint(url, e) or e}") from e
        except Exception as e:  # azure's own configuration errors
            hint = credentials_hint(url, e)
            raise StorageError(
                redact_for(storage_options, f"cannot open {url}: {hint or f'{type(e).__name__}: {e}'}")
            ) from e
        endpoint = _endpoint_of(opts)
        store = cls(
            fs,
            root,
            read_only=read_only,
            single_writer=bool(ours.get("single_writer", False)),
            custom_endpoint=bool(endpoint) and ".core.windows.net" not in endpoint,
            secrets=_secret_strings(storage_options or {}),
            scheme=url.split("://", 1)[0].lower(),
        )
        return store

    async def _get_range(self, bucket: str, name: str, start: int, stop: int | None) -> bytes | None:
        # optional backend: the [azure] extra
        from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

        async with self.fs.service_client.get_blob_client(bucket, name) as bc:
            try:
                if start < 0:  # Azure has no suffix ranges: ask the size first
                    props = await bc.get_blob_properties()
                    start = max(int(props.size) + start, 0)
                    stop = None
                length = None if stop is None else stop - start
                if start == 0 and length is None:
                    downloader = await bc.download_blob()
                else:
                    downloader = await bc.download_blob(offset=start, length=length)
                return bytes(await downloader.readall())
            except ResourceNotFoundError:
                return None
            except HttpResponseError as e:
                if e.status_code == 416:
                    return b""
                raise

    async def _object_size(self, bucket: str, name: str) -> int | None:
        # optional backend: the [azure] extra
        from azure.core.exceptions import ResourceNotFoundError

        async with self.fs.service_client.get_blob_client(bucket, name) as bc:
            try:
                props = await bc.get_blob_properties()
            except ResourceNotFoundError:
                return None
            return int(props.size)

    async def _read_with_generation(self, bucket: str, name: str) -> tuple[bytes | None, str | None]:
        # optional backend: the [azure] extra
        from azure.core.exceptions import ResourceNotFoundError

        async with self.fs.service_client.get_blob_client(bucket, name) as bc:
            try:
                downloader = await bc.download_blob()
                data = await downloader.readall()
            except ResourceNotFoundError:
                return None, None
            return bytes(data), str(downloader.properties.etag)

    async def _write_conditional(self, bucket: str, name: str, data: bytes, if_generation: str | None) -> str:
        # optional backend: the [azure] extra
        from azure.core.exceptions import (
            HttpResponseError,
            ResourceExistsError,
            ResourceModifiedError,
            ResourceNotFoundError,
        )

        cond: dict[str, Any] = {"if_none_match": "*"} if if_generation is None else {"if_match": if_generation}
        async with self.fs.service_client.get_blob_client(bucket, name) as bc:
            try:
                resp = await bc.upload_blob(data, overwrite=True, **cond)
            except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError) as e:
                raise ConditionFailedError(str(getattr(e, "error_code", "") or e.status_code)) from e
            except HttpResponseError as e:
                if e.status_code in (409, 412):
                    raise ConditionFailedError(str(e.status_code)) from e
                raise
        return str(resp["etag"])

    async def _write_plain(self, bucket: str, name: str, data: bytes) -> str:
        async with self.fs.service_client.get_blob_client(bucket, name) as bc:
            resp = await bc.upload_blob(data, overwrite=True)
        return str(resp["etag"])


def redact_for(storage_options: dict[str, Any] | None, text: str) -> str:
    """``text`` with the secrets in ``storage_options`` removed."""

    return redact(text, _secret_strings(storage_options or {}))
