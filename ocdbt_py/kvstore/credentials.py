"""What to do when an object store refuses us for want of credentials: :func:`credentials_hint`.

Every backend (fsspec's s3fs/gcsfs/adlfs, our direct S3/GCS/Azure clients, obstore) reports a
missing or refused credential with its own exception class.  This module recognises them by
class name and message -- so it needs none of those libraries -- and says, in one line, what
the user can do for the store's scheme: ``-S anon=true`` for public data, or the usual ways to
give credentials.  Backends call it when they turn a library error into a
:class:`~ocdbt_py.errors.StorageError` (see :func:`storage_failure`).
"""

from __future__ import annotations

import re

from ocdbt_py.errors import StorageError

__all__ = ["credentials_hint", "is_credentials_error", "storage_failure", "ADVICE"]

#: Exception class names (any module) that mean "no usable credentials".
_CLASSES = frozenset({
    # botocore / aiobotocore (s3fs)
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoAuthTokenError",
    "UnauthorizedSSOTokenError", "SSOTokenLoadError", "TokenRetrievalError",
    # google-auth (gcsfs)
    "DefaultCredentialsError", "RefreshError",
    # azure-identity / azure-core (adlfs)
    "ClientAuthenticationError", "CredentialUnavailableError",
    # obstore
    "UnauthenticatedError", "PermissionDeniedError",
})

#: Messages (any class) that mean the same: missing, refused, expired or malformed credentials.
_MESSAGES = re.compile(
    r"unable to locate credentials|no credentials|could not find default credentials|missing credentials|"
    r"must provide either a connection_string or account_name|invalidaccesskeyid|signaturedoesnotmatch|"
    r"expiredtoken|noauthenticationinformation|authenticationfailed|anonymous caller does not have",
    re.IGNORECASE,
)
#: Messages that mean it only from an HTTP-level error class (``ClientError``, ``HttpError`` ...).
_HTTP_MESSAGES = re.compile(r"accessdenied|access denied|(?<!\d)40[13](?!\d)|forbidden|unauthori[sz]ed|credential",
                            re.IGNORECASE)
_HTTP_CLASSES = frozenset({"ClientError", "HttpError", "HttpResponseError", "GenericError", "HTTPError",
                           "HttpStatusError"})

#: The usual ways to give credentials, per URL scheme.
ADVICE = {
    "s3": "for a public bucket pass -S anon=true; otherwise set AWS_ACCESS_KEY_ID and "
          "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, ~/.aws/credentials), or pass -S key=... -S secret=...",
    "gs": "for a public bucket pass -S token=anon; otherwise run 'gcloud auth application-default login', "
          "set GOOGLE_APPLICATION_CREDENTIALS=key.json, or pass -S token=key.json",
    "az": "for a public container pass -S account_name=NAME -S anon=true; otherwise set "
          "AZURE_STORAGE_CONNECTION_STRING (or AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY), "
          "or pass -S account_name=... -S account_key=...",
}
_SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "az": "az", "abfs": "az", "abfss": "az",
            "adl": "az"}


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes and contexts (at most 8, no cycles)."""
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < 8:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _about_credentials(e: BaseException) -> bool:
    """Whether this one exception (not its causes) is about credentials."""
    name = type(e).__name__
    if name in _CLASSES or _MESSAGES.search(str(e)):
        return True
    return (name in _HTTP_CLASSES or isinstance(e, PermissionError)) and bool(_HTTP_MESSAGES.search(str(e)))


def is_credentials_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the store wants other or more credentials."""
    return any(_about_credentials(e) for e in _chain(exc))


def credentials_hint(url: str, exc: BaseException) -> str | None:
    """One line saying the credentials are missing or refused and what to do, for ``url``'s
    scheme; ``None`` when ``exc`` is not about credentials."""
    chain = _chain(exc)
    culprit = next((e for e in chain if _about_credentials(e)), None)
    if culprit is None:
        return None
    scheme = _SCHEMES.get(url.split("://", 1)[0].lower()) if "://" in url else None
    if scheme is None and type(culprit).__name__ not in _CLASSES:
        return None  # a local or other filesystem's permission error is not about credentials
    # a failed look-up of the machine's own credentials (cloud instance metadata) is "none found"
    lookup = any(re.search(r"169\.254\.169\.254|metadata|/api/token|credential provider|unable to locate|"
                           r"could not (automatically )?(find|determine)", str(e), re.IGNORECASE) for e in chain)
    refused = not lookup and bool(re.search(r"denied|forbidden|403|invalid|signature|expired|failed to authenticate",
                                            str(culprit), re.IGNORECASE))
    what = "the store refused our credentials" if refused else "no usable credentials were found"
    advice = ADVICE.get(scheme or "", "pass the store's credentials as -S options (see its fsspec backend)")
    return f"{what} ({advice})"


def storage_failure(what: str, where: str, exc: BaseException, redact: object = None) -> StorageError:
    """The :class:`StorageError` for ``what`` (``"reading"``, ...) of ``where`` failing with
    ``exc``: the credentials hint when it is about credentials, else the library's class and
    message.  ``redact`` (a ``str -> str`` callable) hides secrets in the text."""
    hint = credentials_hint(where, exc)
    text = f"{what} {where} failed: " + (hint if hint is not None else f"{type(exc).__name__}: {exc}")
    if callable(redact):
        text = redact(text)
    return StorageError(text)
