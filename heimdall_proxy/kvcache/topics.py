"""Which pod sent a KV-event message, told by its topic.

One SUB socket connected to every pod's publisher keeps the file descriptors to one TCP
connection per pod, but a message no longer says which connection it came in on. vLLM puts
the topic first (`--kv-events-config '{"topic": ...}'`) and llm-d names the pod in it,
`kv@<pod>@<model>` (its deployments write `kv@${POD_IP}@<model>`; llm-d's indexer reads the
pod from the topic the same way). `<pod>` may be the pod's name, its publisher's
`host:port`, its serving `host:port`, or its host when no other followed pod has that host.
When a single pod is followed, every message is its own, whatever the topic says.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit


def topic_ident(topic: bytes) -> str:
    """The pod part of `kv@<pod>@<model>` (the whole topic when it has no `@`)."""
    text = topic.decode("utf-8", "replace")
    parts = text.split("@", 2)
    return parts[1] if len(parts) >= 2 else text


def endpoint_hostport(endpoint: str) -> str | None:
    """`host:port` of a `tcp://host:port` publisher address (brackets of IPv6 dropped)."""
    if not endpoint.startswith("tcp://"):
        return None
    try:
        parts = urlsplit(endpoint)
        port = parts.port
    except ValueError:
        return None
    if parts.hostname is None or port is None:
        return None
    return f"{parts.hostname}:{port}"


@dataclass(slots=True)
class _Names:
    pod_host: str
    names: tuple[str, ...]


@dataclass(slots=True)
class TopicRoutes:
    """The followed pods by every name a topic may give them; kept up to date in O(1) per pod
    joining or leaving, and resolving a topic in O(1) (cached per topic)."""

    _exact: dict[str, str] = field(default_factory=dict)
    _hosts: dict[str, set[str]] = field(default_factory=dict)
    _pods: dict[str, _Names] = field(default_factory=dict)
    _cache: dict[bytes, str | None] = field(default_factory=dict)

    def add(self, pod: str, host: str, hostport: str, publisher: str) -> None:
        """Follow `pod`, serving at `hostport` on `host`, publishing at `publisher`."""
        self.remove(pod)
        names = tuple(n for n in (pod, hostport, endpoint_hostport(publisher)) if n)
        for name in names:
            self._exact.setdefault(name, pod)
        self._hosts.setdefault(host, set()).add(pod)
        self._pods[pod] = _Names(host, names)
        self._cache.clear()

    def remove(self, pod: str) -> None:
        entry = self._pods.pop(pod, None)
        if entry is None:
            return
        for name in entry.names:
            if self._exact.get(name) == pod:
                del self._exact[name]
        others = self._hosts.get(entry.pod_host)
        if others is not None:
            others.discard(pod)
            if not others:
                del self._hosts[entry.pod_host]
        self._cache.clear()

    def __len__(self) -> int:
        return len(self._pods)

    def pod_of(self, topic: bytes) -> str | None:
        """The followed pod `topic` names, or None when it names none or several."""
        try:
            return self._cache[topic]
        except KeyError:
            pass
        if len(self._pods) == 1:
            found: str | None = next(iter(self._pods))
        else:
            ident = topic_ident(topic)
            found = self._exact.get(ident)
            if found is None:
                same_host = self._hosts.get(ident.strip("[]"))
                if same_host is not None and len(same_host) == 1:
                    found = next(iter(same_host))
        if len(self._cache) < 1 << 16:  # topics are few; a flood of odd ones is not kept
            self._cache[topic] = found
        return found
