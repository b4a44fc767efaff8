"""Who is asking: optional API keys (as vLLM's `--api-key`) and the caller identity that owns
stored responses.

- With keys (`--api-key`, repeatable, or `HEIMDALL_API_KEYS`), every route but `/health`,
  `/ready`, `/metrics` and the live page's own HTML (`--live-page`: it holds no data, and
  its data routes need an admin key) needs `Authorization: Bearer <key>`; a missing or wrong
  key gets an OpenAI-shaped 401. Routes forwarded only because an operator allowlisted them
  need an admin key (`--admin-api-key`). Keys are compared in constant time and never
  logged: the caller is known by a digest of its key.
- Without keys, the caller is the value of the owner header when one is configured
  (`--owner-header`, e.g. a header an authenticating proxy in front sets), else one shared
  owner ("")."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web

from heimdall_proxy.framework.errors import RequestError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_CALLER = web.RequestKey("caller", str)


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def caller_of(request: web.Request) -> str:
    """The caller a guarded route authenticated ("" when none was needed)."""
    caller = request.get(_CALLER, "")
    return caller if isinstance(caller, str) else ""


def _unauthorized(message: str) -> RequestError:
    return RequestError(
        401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
    )


class Auth:
    def __init__(
        self,
        api_keys: Iterable[str] = (),
        admin_keys: Iterable[str] = (),
        owner_header: str | None = None,
    ) -> None:
        self._keys = tuple(k.encode() for k in api_keys if k)
        self._admin = tuple(k.encode() for k in admin_keys if k)
        self.owner_header = owner_header or None
        #: Whether requests need a key (a plain attribute: `caller` runs on every request).
        self.enabled = bool(self._keys or self._admin)
        #: Whether `caller` depends on the request at all: without keys and without an owner
        #: header every caller is "" and nothing is refused.
        self.identifies = self.enabled or self.owner_header is not None

    @staticmethod
    def _matches(given: bytes, keys: tuple[bytes, ...]) -> bool:
        found = False
        for key in keys:  # every key compared, in constant time each
            found |= hmac.compare_digest(given, key)
        return found

    def caller(self, request: web.Request, admin: bool = False) -> str:
        """Authenticate `request`. Raises RequestError(401) for a missing or wrong key, 403
        for a user key on an admin route."""
        if not self.enabled:
            if self.owner_header:
                value = request.headers.get(self.owner_header, "")
                return f"header:{value}" if value else ""
            return ""
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _unauthorized(
                "You didn't provide an API key. Provide it in the Authorization header as "
                "'Bearer YOUR_KEY'."
            )
        given = token.strip().encode()
        if self._matches(given, self._admin):
            return "key:" + key_digest(token.strip())
        if self._matches(given, self._keys):
            if admin:
                raise RequestError(
                    403,
                    "This route needs an admin API key.",
                    code="permission_denied",
                )
            return "key:" + key_digest(token.strip())
        raise _unauthorized("Incorrect API key provided.")

    def guard(self, handler: Handler, admin: bool = False) -> Handler:
        """`handler` behind this authentication; the caller is kept on the request. A plain
        function that hands back the handler's awaitable: a coroutine frame of its own would
        be passed through again on every suspension of the request (bench/RESULTS.md)."""

        def guarded(request: web.Request) -> Awaitable[web.StreamResponse]:
            request[_CALLER] = self.caller(request, admin)
            return handler(request)

        guarded.__name__ = getattr(handler, "__name__", "guarded")
        return guarded
