"""What `--tls-min-version` and `--tls-cipher-suites` can mean for a grpcio server.

grpcio (BoringSSL underneath) negotiates TLS 1.2 or 1.3 and offers no API for the minimum version; its only
knob is the `GRPC_SSL_CIPHER_SUITES` environment variable, an OpenSSL-style list of the TLS 1.2 suites,
read once per process when the first TLS credentials are made. So:

- `--tls-min-version VersionTLS12` is what the server enforces anyway and is accepted; `VersionTLS13` (refuse
  TLS 1.2 clients) and `VersionTLS10`/`VersionTLS11` (admit clients grpcio always refuses) cannot be
  honoured and are refused with that explanation.
- `--tls-cipher-suites` takes the reference's Go names; the TLS 1.2 suites BoringSSL implements are
  translated and exported as `GRPC_SSL_CIPHER_SUITES`, which gRPC reads when it is first imported: the command
  line does it before anything imports grpc, and the server refuses to start if it was too late. The TLS 1.3
  suite names are accepted and have no effect, as in the reference (TLS 1.3 suites are not configurable
  there either); names of suites BoringSSL does not offer are refused."""

from __future__ import annotations

import os
from collections.abc import Iterable

CIPHER_SUITES_ENV = "GRPC_SSL_CIPHER_SUITES"

# Go crypto/tls name → OpenSSL/BoringSSL name, for the TLS 1.2 suites BoringSSL offers.
GO_TO_OPENSSL = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    # Go's older spellings of the two ChaCha20 suites
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305": "ECDHE-RSA-CHACHA20-POLY1305",
}
TLS13_SUITES = frozenset({"TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"})
TLS_VERSIONS = ("VersionTLS10", "VersionTLS11", "VersionTLS12", "VersionTLS13")


class TlsPolicyError(ValueError):
    """A TLS setting that cannot be honoured; the message says why and what to do."""


def check_min_version(value: str) -> None:
    if value in ("", "VersionTLS12"):
        return
    if value not in TLS_VERSIONS:
        raise TlsPolicyError(
            f"--tls-min-version {value!r}: unknown TLS version; supported values: {', '.join(TLS_VERSIONS)}"
        )
    if value == "VersionTLS13":
        raise TlsPolicyError(
            "--tls-min-version VersionTLS13 cannot be enforced: the gRPC library always accepts TLS 1.2 as well; "
            "terminate TLS 1.3-only in front of the EPP, or drop the flag"
        )
    raise TlsPolicyError(
        f"--tls-min-version {value} cannot be honoured: the gRPC library never negotiates below TLS 1.2; use "
        "VersionTLS12 or drop the flag"
    )


def grpc_cipher_list(names: Iterable[str]) -> str:
    """The `GRPC_SSL_CIPHER_SUITES` value for `--tls-cipher-suites` ("" when nothing is to be set)."""
    openssl: list[str] = []
    unknown: list[str] = []
    for name in names:
        name = name.strip()
        if not name or name in TLS13_SUITES:
            continue
        suite = GO_TO_OPENSSL.get(name)
        if suite is None:
            unknown.append(name)
        elif suite not in openssl:
            openssl.append(suite)
    if unknown:
        raise TlsPolicyError(
            f"--tls-cipher-suites: {', '.join(unknown)} cannot be used by the gRPC library's TLS; supported: "
            f"{', '.join(sorted(n for n in GO_TO_OPENSSL if n.endswith(('SHA', 'SHA256', 'SHA384'))))} "
            f"(TLS 1.3 suites {', '.join(sorted(TLS13_SUITES))} are always on)"
        )
    return ":".join(openssl)


def apply_cipher_suites(names: Iterable[str]) -> str:
    """Exports the cipher list for grpcio; call before `grpc` is first imported. Returns it ("" for none)."""
    value = grpc_cipher_list(names)
    if value:
        os.environ[CIPHER_SUITES_ENV] = value
    return value


def cipher_suites_in_effect(names: Iterable[str]) -> bool:
    """Whether the environment gRPC read at import carries the list for `names` (True when there is none)."""
    value = grpc_cipher_list(names)
    return not value or os.environ.get(CIPHER_SUITES_ENV) == value
