""":func:`ocdbt_py.kvstore.credentials.credentials_hint` recognises the credential errors of
every backend's client library (the real exception classes, where installed) and says what to
do for the URL's scheme; other errors pass through unchanged."""

from __future__ import annotations

import pytest

from ocdbt_py.kvstore.credentials import ADVICE, credentials_hint, storage_failure


def _botocore() -> list[BaseException]:
    exc = pytest.importorskip("botocore.exceptions")
    denied = exc.ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "GetObject")
    return [exc.NoCredentialsError(), exc.PartialCredentialsError(provider="env", cred_var="secret"), denied]


def _google() -> list[BaseException]:
    exc = pytest.importorskip("google.auth.exceptions")
    return [exc.DefaultCredentialsError("Could not automatically determine credentials"), exc.RefreshError("bad")]


def _azure() -> list[BaseException]:
    exc = pytest.importorskip("azure.core.exceptions")
    return [exc.ClientAuthenticationError("Server failed to authenticate the request")]


def _obstore() -> list[BaseException]:
    exc = pytest.importorskip("obstore.exceptions")
    return [exc.GenericError("Generic S3 error: ... 403 Forbidden"), exc.UnauthenticatedError("no token"),
            exc.PermissionDeniedError("denied")]


@pytest.mark.parametrize("scheme,errors", [("s3", _botocore), ("gs", _google), ("az", _azure), ("s3", _obstore)])
def test_each_library_s_credential_errors_get_our_hint(scheme: str, errors: object) -> None:
    for e in errors():  # type: ignore[operator]
        hint = credentials_hint(f"{scheme}://bucket/db", e)
        assert hint is not None, repr(e)
        assert ADVICE[scheme] in hint and "\n" not in hint
        wrapped = RuntimeError("while reading")
        wrapped.__cause__ = e
        assert credentials_hint(f"{scheme}://bucket/db", wrapped) == hint  # found down the cause chain
        msg = str(storage_failure("reading", f"{scheme}://bucket/db/manifest.ocdbt", e))
        assert msg.startswith(f"reading {scheme}://bucket/db/manifest.ocdbt failed: ") and type(e).__name__ not in msg


def test_missing_and_refused_are_told_apart() -> None:
    exc = pytest.importorskip("botocore.exceptions")
    assert credentials_hint("s3://b/k", exc.NoCredentialsError()).startswith("no usable credentials were found")
    denied = exc.ClientError({"Error": {"Code": "InvalidAccessKeyId", "Message": "bad key"}}, "GetObject")
    assert credentials_hint("s3://b/k", denied).startswith("the store refused our credentials")
    # the machine's own credential look-up (instance metadata) failing means none were found
    imds = RuntimeError("Error performing PUT http://169.254.169.254/latest/api/token: 403 Forbidden")
    imds.__cause__ = exc.NoCredentialsError()
    assert credentials_hint("s3://b/k", imds).startswith("no usable credentials were found")


def test_other_errors_are_left_alone() -> None:
    for e in (ConnectionResetError("reset"), TimeoutError("slow"), ValueError("bad range"), KeyError("k")):
        assert credentials_hint("s3://b/k", e) is None
        assert f"{type(e).__name__}: " in str(storage_failure("reading", "s3://b/k", e))
    # a local permission error is not about credentials
    assert credentials_hint("/data/db", PermissionError(13, "Permission denied")) is None
