"""Which headers cross the gateway, in each direction."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy, MultiMapping

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
#: Recomputed or meaningless on the other side of the gateway. The gateway reads a request
#: body decoded (aiohttp undoes a Content-Encoding) and forwards it decoded, so the client's
#: Content-Encoding must not go with it.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect", "content-encoding"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length"}
#: Headers the gateway writes itself; a client-sent copy is never trusted.
OWNED = frozenset({"x-decoder-host-port", "x-prefiller-host-port", "x-encoder-hosts-ports"})
OWNED_PREFIXES = ("mif-", "x-gateway-")


_NONE: frozenset[str] = frozenset()
_REQUEST_DROP_OWNED = _REQUEST_DROP | OWNED


def _connection_tokens(headers: MultiMapping[str]) -> frozenset[str]:
    """Header names listed in every Connection header (a message may carry several)."""
    if "connection" not in headers:  # the usual HTTP/1.1 keep-alive message: nothing listed
        return _NONE
    values = headers.getall("connection", ())
    return frozenset(t.strip().lower() for v in values for t in v.split(","))


class UpstreamCredentials:
    """What a pod gets for Authorization: the client's own header only when the gateway
    neither checks keys (`gateway_keys`) nor has a key for the pods (`pod_key`); else the
    pod key, or nothing. A key a client presented to the gateway never reaches a pod."""

    __slots__ = ("authorization", "drop")

    def __init__(self, gateway_keys: bool = False, pod_key: str | None = None) -> None:
        replace = gateway_keys or bool(pod_key)
        #: request headers never forwarded
        self.drop = _REQUEST_DROP_OWNED | {"authorization"} if replace else _REQUEST_DROP_OWNED
        #: the Authorization value the gateway sends instead, if any
        self.authorization = f"Bearer {pod_key}" if pod_key else None

    def __repr__(self) -> str:  # never the key
        return f"UpstreamCredentials(pod_key={self.authorization is not None})"


FORWARD_CLIENT_CREDENTIALS = UpstreamCredentials()


def upstream_request_headers(
    headers: CIMultiDictProxy[str], credentials: UpstreamCredentials = FORWARD_CLIENT_CREDENTIALS
) -> CIMultiDict[str]:
    """The client's headers minus hop-by-hop ones, Host, Content-Length, Content-Encoding and
    any header the gateway owns (`mif-*`, `x-gateway-*`, `x-decoder-host-port`,
    `x-prefiller-host-port`), with Authorization as `credentials` say."""
    # the usual HTTP/1.1 keep-alive message lists nothing: no call for it
    listed = _connection_tokens(headers) if "connection" in headers else _NONE
    drop = credentials.drop | listed if listed else credentials.drop
    out: CIMultiDict[str] = CIMultiDict()
    add = out.add
    for key, value in headers.items():
        lk = key.lower()
        if lk in drop or lk.startswith(OWNED_PREFIXES):
            continue
        add(key, value)
    if credentials.authorization is not None:
        out["Authorization"] = credentials.authorization
    return out


def client_response_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """The upstream's response headers minus hop-by-hop ones and Content-Length (the relay
    sets its own framing)."""
    listed = _connection_tokens(headers) if "connection" in headers else _NONE
    drop = _RESPONSE_DROP | listed if listed else _RESPONSE_DROP
    out: CIMultiDict[str] = CIMultiDict()
    add = out.add
    for key, value in headers.items():
        if key.lower() not in drop:
            add(key, value)
    return out
