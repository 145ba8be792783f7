"""SigV4 signing (ocdbt_py.kvstore.sigv4) against AWS's published examples and botocore's signer."""

from __future__ import annotations

import datetime
import hashlib
import urllib.parse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocdbt_py.kvstore.sigv4 import Credentials, presign_url, sign_headers, uri_encode

# The example credentials and time of AWS's "Signature Version 4 signing examples" for S3.
AKID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
WHEN = datetime.datetime(2013, 5, 24, tzinfo=datetime.timezone.utc)
EMPTY = hashlib.sha256(b"").hexdigest()


def _sig(auth: str) -> str:
    return auth.rsplit("Signature=", 1)[1]


def test_aws_example_get_object_with_range() -> None:
    h = sign_headers("GET", "https://examplebucket.s3.amazonaws.com/test.txt", Credentials(AKID, SECRET),
                     "us-east-1", headers={"Range": "bytes=0-9"}, payload_hash=EMPTY, now=WHEN)
    assert h["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    assert h["x-amz-date"] == "20130524T000000Z" and h["Range"] == "bytes=0-9"


def test_aws_example_list_objects() -> None:
    h = sign_headers("GET", "https://examplebucket.s3.amazonaws.com/?max-keys=2&prefix=J", Credentials(AKID, SECRET),
                     "us-east-1", payload_hash=EMPTY, now=WHEN)
    assert _sig(h["Authorization"]) == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"


def test_aws_example_presigned_url() -> None:
    url = presign_url("GET", "https://examplebucket.s3.amazonaws.com/test.txt", Credentials(AKID, SECRET),
                      "us-east-1", expires=86400, now=WHEN)
    q = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))
    assert q["X-Amz-Signature"] == "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    assert q["X-Amz-Credential"] == "AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"
    assert url.startswith("https://examplebucket.s3.amazonaws.com/test.txt?")


def test_uri_encode() -> None:
    assert uri_encode("a b/c~d_e.f-g", keep_slash=True) == "a%20b/c~d_e.f-g"
    assert uri_encode("a/b+c=d&é", keep_slash=False) == "a%2Fb%2Bc%3Dd%26%C3%A9"


def test_credentials_never_shown() -> None:
    c = Credentials(AKID, SECRET, "tok-secret")
    assert SECRET not in repr(c) and "tok-secret" not in repr(c)
    with pytest.raises(ValueError):
        Credentials("", SECRET)


def test_bad_arguments() -> None:
    c = Credentials(AKID, SECRET)
    with pytest.raises(ValueError):
        presign_url("GET", "https://h/x", c, "us-east-1", expires=0)
    with pytest.raises(ValueError):
        sign_headers("GET", "ftp://h/x", c, "us-east-1")


# -- botocore as the oracle ----------------------------------------------------------------------
botocore_auth = pytest.importorskip("botocore.auth")
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.credentials import Credentials as BotoCredentials  # noqa: E402

_key_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=["Cs"]),
                    min_size=1, max_size=40)


def _frozen(monkeypatch: pytest.MonkeyPatch, when: datetime.datetime) -> None:
    monkeypatch.setattr(botocore_auth, "get_current_datetime", lambda: when.replace(tzinfo=None))


def _boto_headers(url: str, headers: dict[str, str], creds: Credentials, region: str) -> dict[str, Any]:
    req = AWSRequest(method="GET", url=url, headers=dict(headers))
    botocore_auth.S3SigV4Auth(BotoCredentials(creds.access_key, creds.secret_key, creds.token), "s3",
                              region).add_auth(req)
    return dict(req.headers.items())


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEXAMPLE//token=="])
@pytest.mark.parametrize("url,headers", [
    ("http://127.0.0.1:9000/bucket/dir/file.bin", {"Range": "bytes=5-99"}),
    ("https://bucket.s3.eu-west-1.amazonaws.com/a%20b/c%2Bd", {}),
    ("http://localhost:4566/bucket/?list-type=2&prefix=x%2Fy&encoding-type=url", {}),
    ("http://[::1]:9000/bucket/k", {"Range": "bytes=0-0"}),
])
def test_headers_match_botocore(monkeypatch: pytest.MonkeyPatch, url: str, headers: dict[str, str],
                                token: str | None) -> None:
    _frozen(monkeypatch, WHEN)
    creds = Credentials(AKID, SECRET, token)
    want = _boto_headers(url, headers, creds, "eu-west-1")
    got = sign_headers("GET", url, creds, "eu-west-1", headers=headers, payload_hash=EMPTY, now=WHEN)
    assert got["Authorization"] == want["Authorization"]
    if token:
        assert got["x-amz-security-token"] == want["X-Amz-Security-Token"] == token


@settings(max_examples=60, deadline=None)
@given(name=_key_text, region=st.sampled_from(["us-east-1", "ap-southeast-2", "cn-north-1"]))
def test_presigned_urls_match_botocore(name: str, region: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        _frozen(mp, WHEN)
        creds = Credentials(AKID, SECRET, "tok/en+=")
        url = f"https://bucket.s3.{region}.amazonaws.com/{uri_encode(name, keep_slash=True)}"
        req = AWSRequest(method="GET", url=url)
        botocore_auth.S3SigV4QueryAuth(BotoCredentials(AKID, SECRET, "tok/en+="), "s3", region,
                                       expires=900).add_auth(req)
        got = presign_url("GET", url, creds, region, expires=900, now=WHEN)

    def parts(u: str) -> tuple[str, dict[str, str]]:
        s = urllib.parse.urlsplit(u)
        return s.path, dict(urllib.parse.parse_qsl(s.query))

    assert parts(got) == parts(req.url)
