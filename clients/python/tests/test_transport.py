"""Bearer tokens and (mutual) TLS, against servers started for them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator, Tuple

import grpc
import pytest

from harness import Database, Server
from idempotency_coordinator import AsyncClient, AsyncLeaseContext, Client, CoordinatorError

TOKEN = "test-token-7f3a9c"


@pytest.fixture(scope="module")
def auth_server(database: Database, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text(f"{TOKEN} tenant-python\n")
    srv = Server(database.url, ["--auth-tokens", str(tokens)])
    try:
        yield srv
    finally:
        srv.stop()


def test_bearer_token(auth_server: Server, scope: str, key: str) -> None:
    assert auth_server.addr
    with Client.connect(auth_server.addr, bearer_token=TOKEN) as good:
        assert good.run_once(scope, key, lambda ctx: "ok").value == "ok"
    with Client.connect(auth_server.addr) as anonymous:
        with pytest.raises(CoordinatorError) as denied:
            anonymous.run_once(scope, key, lambda ctx: "never")
    assert denied.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert denied.value.reason == "UNAUTHENTICATED"
    with Client.connect(auth_server.addr, bearer_token="wrong") as wrong:
        with pytest.raises(CoordinatorError) as denied:
            wrong.get(scope, key)
    assert denied.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_bearer_token_async(auth_server: Server, scope: str, key: str) -> None:
    assert auth_server.addr

    async def work(ctx: AsyncLeaseContext) -> str:
        return "ok"

    async with AsyncClient.connect(auth_server.addr, bearer_token=TOKEN) as good:
        assert (await good.run_once(scope, key, work)).value == "ok"
    async with AsyncClient.connect(auth_server.addr) as anonymous:
        with pytest.raises(CoordinatorError) as denied:
            await anonymous.run_once(scope, key, work)
    assert denied.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert denied.value.reason == "UNAUTHENTICATED"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _issue(d: Path, name: str, subject: str, ext: str) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=d)
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=d)
    (d / f"{name}.ext").write_text(ext)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-sha256",
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.pem",
        cwd=d,
    )


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key", cwd=d)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-subj",
        "/CN=test CA",
        "-days",
        "2",
        "-sha256",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-out",
        "ca.pem",
        cwd=d,
    )
    _issue(
        d,
        "server",
        "/CN=localhost",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    _issue(
        d,
        "client",
        "/CN=python client",
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    return d


@pytest.fixture(scope="module")
def tls_server(database: Database, pki: Path) -> Iterator[Server]:
    srv = Server(
        database.url,
        [
            "--tls-cert",
            str(pki / "server.pem"),
            "--tls-key",
            str(pki / "server.key"),
            "--tls-client-ca",
            str(pki / "ca.pem"),
        ],
    )
    try:
        yield srv
    finally:
        srv.stop()


def _files(pki: Path) -> Tuple[bytes, bytes, bytes]:
    return (pki / "ca.pem").read_bytes(), (pki / "client.key").read_bytes(), (pki / "client.pem").read_bytes()


def test_mutual_tls(tls_server: Server, pki: Path, scope: str, key: str) -> None:
    ca, client_key, client_cert = _files(pki)
    target = f"localhost:{tls_server.port}"
    with Client.connect(target, root_certificates=ca, private_key=client_key, certificate_chain=client_cert) as c:
        assert c.run_once(scope, key, lambda ctx: {"tls": True}).value == {"tls": True}
        assert c.run_once(scope, key, lambda ctx: "never").replayed
    # Without a client certificate the handshake is refused.
    with Client.connect(target, root_certificates=ca, max_retries=0, call_timeout=3) as c:
        with pytest.raises(CoordinatorError) as refused:
            c.get(scope, key)
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_async(tls_server: Server, pki: Path, scope: str, key: str) -> None:
    ca, client_key, client_cert = _files(pki)

    async def work(ctx: AsyncLeaseContext) -> int:
        return ctx.attempt

    async with AsyncClient.connect(
        f"127.0.0.1:{tls_server.port}", root_certificates=ca, private_key=client_key, certificate_chain=client_cert
    ) as c:
        assert (await c.run_once(scope, key, work)).value == 1
