"""Certificates and keys for the throwaway cluster, made with the `openssl` CLI.

ECDSA P-256 keys keep generation to milliseconds, so every `up` gets a fresh PKI. Each component
has its own client identity so the audit log can tell their requests apart.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

_DAYS = "3650"
_CLIENT_EXT = (
    "basicConstraints=critical,CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=clientAuth\n"
)


class PKIError(RuntimeError):
    """openssl is missing or failed."""


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    ca: KeyPair
    apiserver: KeyPair
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair
    sa_key: Path
    sa_pub: Path
    clients: dict[str, KeyPair]


# client name -> (CN, O); O=system:masters grants cluster-admin without any RBAC object.
CLIENTS: dict[str, tuple[str, str | None]] = {
    "admin": ("testenv-admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", None),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
    # The API server's identity towards kubelets (logs, exec, port-forward on real nodes).
    "kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
    # Bound to system:node-proxier by the default RBAC.
    "kube-proxy": ("system:kube-proxy", None),
}
NODE_GROUP = "system:nodes"
BASE_SANS = (
    "IP:127.0.0.1",
    "DNS:localhost",
    "IP:10.96.0.1",  # the `kubernetes` Service: what in-cluster clients dial
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PKIError(f"openssl {args[0]} failed: {proc.stderr.strip()}")


def _new_key(path: Path, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-out", str(path), cwd=cwd)  # fmt: skip


def _sign(dir_: Path, name: str, subject: str, extensions: str, ca: KeyPair) -> KeyPair:
    pair = KeyPair(dir_ / f"{name}.crt", dir_ / f"{name}.key")
    _new_key(pair.key, dir_)
    csr = dir_ / f"{name}.csr"
    ext = dir_ / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", "-key", str(pair.key), "-subj", subject, "-out", str(csr), cwd=dir_)
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
             "-set_serial", f"0x{secrets.randbits(63):x}", "-days", _DAYS,
             "-extfile", str(ext), "-out", str(pair.cert), cwd=dir_)  # fmt: skip
    csr.unlink()
    ext.unlink()
    return pair


def _paths(dir_: Path) -> PKI:
    def pair(name: str) -> KeyPair:
        return KeyPair(dir_ / f"{name}.crt", dir_ / f"{name}.key")

    return PKI(
        ca=pair("ca"),
        apiserver=pair("apiserver"),
        front_proxy_ca=pair("front-proxy-ca"),
        front_proxy_client=pair("front-proxy-client"),
        sa_key=dir_ / "sa.key",
        sa_pub=dir_ / "sa.pub",
        clients={name: pair(f"client-{name}") for name in CLIENTS},
    )


def load_or_generate(dir_: Path, server_ips: tuple[str, ...] = ()) -> PKI:
    """Reuse a complete PKI from an earlier start (nothing in it depends on ports), else
    generate one; saves the openssl calls on every warm start. `server_ips` are extra
    addresses the API server's serving certificate must name (the real nodes' bridge); the
    serving certificate alone is re-signed when they change."""
    pki = _load_or_generate(dir_)
    sans = ",".join([*BASE_SANS, *(f"IP:{ip}" for ip in server_ips)])
    recorded = dir_ / "apiserver.sans"
    if not recorded.is_file() or recorded.read_text() != sans:
        _sign_apiserver(dir_, pki.ca, sans)
        recorded.write_text(sans)
    return pki


def node_client(dir_: Path, ca: KeyPair, node: str) -> KeyPair:
    """A kubelet's client certificate (CN system:node:<node>, O system:nodes: what the Node
    authorizer and NodeRestriction admission expect), reused across starts."""
    pair = KeyPair(dir_ / f"node-{node}.crt", dir_ / f"node-{node}.key")
    if pair.cert.is_file() and pair.key.is_file():
        return pair
    pair = _sign(dir_, f"node-{node}", f"/O={NODE_GROUP}/CN=system:node:{node}", _CLIENT_EXT, ca)
    pair.key.chmod(0o600)
    return pair


def _sign_apiserver(dir_: Path, ca: KeyPair, sans: str) -> KeyPair:
    pair = _sign(
        dir_,
        "apiserver",
        "/CN=kube-apiserver",
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n",
        ca,
    )
    pair.key.chmod(0o600)
    return pair


def _load_or_generate(dir_: Path) -> PKI:
    existing = _paths(dir_)
    files = [
        existing.ca,
        existing.apiserver,
        existing.front_proxy_ca,
        existing.front_proxy_client,
        *existing.clients.values(),
    ]
    if (
        existing.sa_key.is_file()
        and existing.sa_pub.is_file()
        and all(p.cert.is_file() and p.key.is_file() for p in files)
    ):
        return existing
    return generate(dir_)


def _new_ca(dir_: Path, name: str, cn: str) -> KeyPair:
    ca = KeyPair(dir_ / f"{name}.crt", dir_ / f"{name}.key")
    _new_key(ca.key, dir_)
    _openssl("req", "-x509", "-new", "-key", str(ca.key), "-subj", f"/CN={cn}",
             "-days", _DAYS, "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
             "-out", str(ca.cert), cwd=dir_)  # fmt: skip
    return ca


def generate(dir_: Path) -> PKI:
    """Write a CA, the apiserver serving cert, client certs and the service-account key pair."""
    if shutil.which("openssl") is None:
        raise PKIError("the openssl CLI is required to generate testenv certificates")
    dir_.mkdir(parents=True, exist_ok=True)
    ca = _new_ca(dir_, "ca", "gpu-operator-testenv-ca")
    # The aggregation layer's CA: kube-controller-manager and kube-scheduler read it from
    # kube-system/extension-apiserver-authentication and log errors every second without it.
    front_proxy_ca = _new_ca(dir_, "front-proxy-ca", "gpu-operator-testenv-front-proxy-ca")
    sans = ",".join(BASE_SANS)
    apiserver = _sign_apiserver(dir_, ca, sans)
    (dir_ / "apiserver.sans").write_text(sans)
    client_ext = _CLIENT_EXT
    clients = {}
    for name, (cn, org) in CLIENTS.items():
        subject = f"/O={org}/CN={cn}" if org else f"/CN={cn}"
        clients[name] = _sign(dir_, f"client-{name}", subject, client_ext, ca)
    front_proxy_client = _sign(
        dir_, "front-proxy-client", "/CN=front-proxy-client", client_ext, front_proxy_ca
    )
    sa_key, sa_pub = dir_ / "sa.key", dir_ / "sa.pub"
    _new_key(sa_key, dir_)
    _openssl("pkey", "-in", str(sa_key), "-pubout", "-out", str(sa_pub), cwd=dir_)
    for path in dir_.iterdir():
        if path.suffix == ".key":
            path.chmod(0o600)
    return PKI(
        ca=ca,
        apiserver=apiserver,
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=front_proxy_client,
        sa_key=sa_key,
        sa_pub=sa_pub,
        clients=clients,
    )
