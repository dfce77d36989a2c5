"""How both processes reach a Consul agent's HTTP API in production form: http or https
(CA, client certificate), the ACL token sent as `X-Consul-Token`, and the datacenter.
The token is never part of a repr or a log line; a 403 becomes one message naming what
was refused."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

import httpx

TOKEN_HEADER = "X-Consul-Token"


class ConsulAccessError(Exception):
    """The access settings cannot be used (a token file or certificate that cannot be read)."""


@dataclass(frozen=True)
class ConsulAccess:
    """Everything but the address needed to talk to an agent, as Consul's own CLI takes it.

    `token` wins over `token_file` (read once, when a client is made). An address written
    `https://host:port` means https whatever `scheme` says."""

    scheme: str = "http"
    token: str = field(default="", repr=False)
    token_file: str = ""
    ca_cert: str = ""
    client_cert: str = ""
    client_key: str = ""
    datacenter: str = ""

    def base_url(self, address: str) -> str:
        if address.startswith(("http://", "https://")):
            return address
        return f"{self.scheme}://{address}"

    def secret(self) -> str:
        """The token to send: `token`, else the first line of `token_file`, else none."""
        if self.token or not self.token_file:
            return self.token
        try:
            return Path(self.token_file).read_text().strip()
        except OSError as exc:
            raise ConsulAccessError(f"cannot read the consul token file '{self.token_file}': {exc.strerror}") from None

    def verify(self) -> ssl.SSLContext | bool:
        """What httpx checks the agent's certificate with: our CA, else the system's."""
        context = ssl.create_default_context(cafile=self.ca_cert or None)
        if self.client_cert:
            try:
                context.load_cert_chain(self.client_cert, self.client_key or None)
            except (OSError, ssl.SSLError) as exc:
                raise ConsulAccessError(
                    f"cannot load the consul client certificate '{self.client_cert}': {exc}"
                ) from None
        return context

    def client(self, address: str, timeout: float) -> httpx.AsyncClient:
        """An httpx client for the agent at `address` (HOST:PORT or a URL)."""
        headers = {TOKEN_HEADER: token} if (token := self.secret()) else {}
        base_url = self.base_url(address)
        verify: ssl.SSLContext | bool = self.verify() if base_url.startswith("https://") else True
        return httpx.AsyncClient(base_url=base_url, headers=headers, verify=verify, timeout=timeout)

    def query(self, params: dict[str, str] | None = None) -> dict[str, str]:
        """`params` plus `dc` when a datacenter is chosen (catalog, health and KV take it)."""
        query = dict(params or {})
        if self.datacenter:
            query["dc"] = self.datacenter
        return query


def host_port(address: str) -> str:
    """`address` without its scheme, as messages name the agent."""
    return address.split("://", 1)[-1].rstrip("/")


def refused(address: str, what: str, body: str) -> str:
    """The one line for a 403: Consul's ACLs refused `what` (Consul's own reason after it)."""
    reason = body.strip().splitlines()[0] if body.strip() else "no reason given"
    agent = host_port(address)
    return f"consul at {agent} refused {what} (ACL: permission denied; consul says '{reason}'); check --consul-token"
