"""TLS of polled data sources beyond verify-or-skip: a CA bundle to verify the model server against
(`caCertPath`) and a client certificate for mTLS (`clientCertPath` / `clientKeyPath`), as the reference's
HTTP data sources take them. With `insecureSkipVerify` the CA is not used (as upstream); the client
certificate still is. A source sets these as the optional attributes `ca_cert_path`, `client_cert_path` and
`client_key_path`."""

from __future__ import annotations

import ssl

from llm_epp.datalayer.scrape import DEFAULT_POLL_TIMEOUT, Scraper
from llm_epp.framework.datalayer import DataSource


def _path(source: DataSource, name: str) -> str:
    value = getattr(source, name, "")
    return value if isinstance(value, str) else ""


def source_ssl_context(source: DataSource) -> ssl.SSLContext | None:
    """The TLS context for `source`'s own CA or client certificate; None when it sets neither. Raises
    ValueError naming the file and the problem."""
    ca, cert, key = (_path(source, n) for n in ("ca_cert_path", "client_cert_path", "client_key_path"))
    if not (ca or cert or key):
        return None
    where = source.typed_name
    if source.insecure_skip_verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if ca:
            try:
                ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"{where}: caCertPath {ca}: no usable CA certificate ({_reason(e)})") from None
    if cert or key:
        try:
            ctx.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as e:
            raise ValueError(
                f"{where}: clientCertPath {cert} / clientKeyPath {key}: cannot load the key pair ({_reason(e)})"
            ) from None
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or getattr(err, "reason", None) or str(err)


class TLSScraper(Scraper):
    """A scraper whose https connections use a given TLS context."""

    def __init__(self, context: ssl.SSLContext, *, timeout: float = DEFAULT_POLL_TIMEOUT) -> None:
        super().__init__(timeout=timeout, verify=context.verify_mode != ssl.CERT_NONE)
        self._context = context

    @property
    def ssl_context(self) -> ssl.SSLContext:
        return self._context
