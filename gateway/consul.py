"""The gateway's Consul HTTP client: blocking queries on the agent's HTTP API.

Only what Consul 1.8 offers: `health/service` and `kv` with `?index=&wait=`, reached as
protos.consul_access says (token, TLS, datacenter). Transport and HTTP errors become
ConsulUnavailable here, an ACL refusal ConsulDenied; no httpx error leaves this module.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import Any

import httpx

from protos.consul_access import ConsulAccess, refused

logger = logging.getLogger(__name__)

WAIT = "10s"  # how long Consul may hold a blocking query open
_TIMEOUT_SECS = 20.0  # above WAIT plus Consul's jitter (wait / 16)


class ConsulUnavailable(Exception):
    """The agent did not answer, or answered with an error."""


class ConsulDenied(ConsulUnavailable):
    """The agent's ACLs refused the request (HTTP 403): a token problem, not an outage."""


class ConsulClient:
    """One agent's HTTP API. Create it in the event loop that uses it; `close()` ends it.

    Raises protos.consul_access.ConsulAccessError when the token file or a TLS file
    cannot be read."""

    def __init__(self, address: str, access: ConsulAccess | None = None) -> None:
        self.address = address
        self._access = access or ConsulAccess()
        self._http = self._access.client(address, _TIMEOUT_SECS)
        # httpx logs every request at INFO; a registration or watch round is not news.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    async def blocking_get(self, path: str, index: int, params: dict[str, str] | None = None) -> tuple[Any, int]:
        """GET `path`, held by Consul until its index passes `index` (0 = answer now).

        Returns the JSON body (None for 404, as kv answers an empty prefix) and the new index.
        """
        query = self._access.query(params)
        if index:
            query.update(index=str(index), wait=WAIT)
        try:
            response = await self._http.get(path, params=query)
        except (httpx.HTTPError, ssl.SSLError) as exc:  # a refused client certificate shows after the handshake
            raise ConsulUnavailable(f"consul at {self.address}: {exc!r}") from exc
        new_index = int(response.headers.get("X-Consul-Index", "0") or 0)
        if response.status_code == 404:
            return None, new_index
        if response.status_code == 403:
            raise ConsulDenied(refused(self.address, f"reading {path}", response.text))
        if response.status_code != 200:
            raise ConsulUnavailable(f"consul at {self.address}: HTTP {response.status_code} {response.text.strip()}")
        # An index that goes backwards (agent restarted) restarts the watch from scratch.
        return response.json(), new_index if new_index >= index else 0

    async def check_read(self, path: str, what: str) -> None:
        """Read `path` once; ConsulDenied (naming `what`) when the ACLs refuse it.

        Catalog and health answers leave out what a token may not read rather than
        refuse, so an empty fleet can hide a missing token: a single KV key is refused."""
        try:
            response = await self._http.get(path, params=self._access.query())
        except (httpx.HTTPError, ssl.SSLError) as exc:  # a refused client certificate shows after the handshake
            raise ConsulUnavailable(f"consul at {self.address}: {exc!r}") from exc
        if response.status_code == 403:
            raise ConsulDenied(refused(self.address, what, response.text))

    async def close(self) -> None:
        await self._http.aclose()


async def pause_after_failure(failures: int) -> None:
    """Back off between failed watch rounds: 0.2 s doubling up to 5 s."""
    await asyncio.sleep(min(5.0, 0.2 * 2 ** min(failures, 5)))


class ConsulWatch:
    """One blocking-query watch on a Consul path: each `next()` returns the next answer,
    held by Consul until something changed since the last one (`index`). While the agent
    is away it retries, backing off, and says so once on `log` (`what: <error>; <away>`);
    `next()` tells the caller when the agent has just come back. Set `index` to 0 to ask
    again without waiting for a change."""

    def __init__(
        self,
        consul: ConsulClient,
        path: str,
        params: dict[str, str] | None = None,
        *,
        what: str,
        away: str,
        log: logging.Logger = logger,
    ) -> None:
        self.index = 0
        self._consul = consul
        self._path = path
        self._params = params
        self._what = what
        self._away = away
        self._log = log
        self._failures = 0

    async def next(self) -> tuple[Any, bool]:
        """The next answer, and whether Consul answers again after failing."""
        while True:
            try:
                answer, self.index = await self._consul.blocking_get(self._path, self.index, self._params)
            except ConsulUnavailable as exc:
                self._failures += 1
                if self._failures == 1:
                    self._log.warning("%s: %s; %s", self._what, exc, self._away)
                self.index = 0
                await pause_after_failure(self._failures)
                continue
            back = self._failures > 0
            if back:
                self._log.info("%s: consul answers again", self._what)
            self._failures = 0
            return answer, back
