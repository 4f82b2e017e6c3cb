"""A certificate authority and certificates made by the openssl CLI for the tests that speak TLS (the agent's own
server, the webhook action's receiver)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


def openssl(*args: str | Path) -> None:
    cmd = ["openssl", *(str(a) for a in args)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, f"{' '.join(cmd)}:\n{result.stderr}"


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) of a self-signed CA."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl(
        "req", "-x509", *EC_KEY, "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def make_leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    """(certificate, key) signed by ``ca``, with ``extensions`` (openssl extension lines) added."""
    cert, key, csr, ext = (directory / f"{name}.{s}" for s in ("crt", "key", "csr", "ext"))
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n" + extensions,
        encoding="ascii",
    )
    openssl("req", "-new", *EC_KEY, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
    openssl(
        "x509", "-req", "-in", csr, "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
        "-out", cert, "-days", "2", "-extfile", ext,
    )  # fmt: skip
    return cert, key


def server_for_loopback(directory: Path, ca: tuple[Path, Path], name: str = "server") -> tuple[Path, Path]:
    """A server certificate for https://127.0.0.1."""
    return make_leaf(directory, name, ca, "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
