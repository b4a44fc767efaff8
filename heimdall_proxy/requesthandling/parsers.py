"""Which parser reads a request: the one whose claimed path suffix is the longest that the
request path ends with (llm-d's rule), else the fallback (a parser that claims no path).

Which paths the gateway serves at all is narrower than llm-d's suffix rule, because here
the gateway is the HTTP route too (llm-d's EPP only sees what an HTTPRoute sent it): a
claim `c` is served at the parser's `route_prefix` + `c` (`/v1/chat/completions`,
`/v1/messages`, `/inference/v1/generate`, `/generate`); with a fallback in force, the
standard inference routes no listed parser claims too (the fallback reads them: llm-d's
passthrough-only configs serve all traffic); any other path only when `--allow-route` lists
it, and then the suffix rule and the fallback pick its parser.

llm-d registers the `requestHandler.parsers` list in order and stops at the first parser
that claims no path: it is the fallback, and whatever follows it is skipped. Without a list
its defaults are openai-parser, anthropic-parser, vllmhttp-parser and passthrough-parser
(config/defaults.py)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from heimdall_proxy.framework.plugins import Parser

log = logging.getLogger(__name__)

#: The inference routes of llm-d's default parsers: served by the fallback when no listed
#: parser claims them.
STANDARD_ROUTES = (
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/inference/v1/generate",
)
#: Paths resolved so far are kept (the gateway routes a handful of paths); a client sending
#: endless distinct paths (only allow-listed ones reach here) cannot grow it past this.
MAX_CACHED_PATHS = 4096


def longest_suffix(path: str, suffixes: Iterable[str]) -> str | None:
    """The longest of `suffixes` that `path` ends with as whole path segments (llm-d's rule:
    "chat/completions" before "completions"), the first listed on a tie; None when none."""
    stripped = path.rstrip("/")
    best: str | None = None
    for suffix in suffixes:
        if (best is None or len(suffix) > len(best)) and (
            stripped == suffix or stripped.endswith("/" + suffix)
        ):
            best = suffix
    return best


class ParserTable:
    """The parsers in force, by claimed suffix. Resolution is cached per path."""

    __slots__ = ("_by_suffix", "_cache", "_served", "fallback", "names")

    def __init__(self, parsers: Sequence[tuple[str, Parser]]) -> None:
        self._by_suffix: dict[str, Parser] = {}
        self.fallback: Parser | None = None
        #: name of each parser registered, in order (the skipped ones are not)
        self.names: list[str] = []
        for i, (name, parser) in enumerate(parsers):
            self.names.append(name)
            if not parser.claims:
                self.fallback = parser
                skipped = [n for n, _ in parsers[i + 1 :]]
                if skipped:
                    log.warning(
                        "requestHandler.parsers: %r claims no path, so it is the fallback and "
                        "the parsers after it are never used: %s",
                        name,
                        ", ".join(skipped),
                    )
                break
            for suffix in parser.claims:
                self._by_suffix.setdefault(suffix.strip("/"), parser)  # the first one listed
        self._served: dict[str, Parser] = {}
        for suffix, parser in self._by_suffix.items():
            self._served.setdefault(parser.route_prefix + suffix, parser)
        if self.fallback is not None:
            for route in STANDARD_ROUTES:
                self._served.setdefault(route, self.fallback)
        self._cache: dict[str, Parser | None] = {}

    def claimed(self, path: str) -> Parser | None:
        """The parser serving `path` as one of its claims' routes, None when it is none."""
        return self._served.get(path)

    def resolve(self, path: str) -> Parser | None:
        """The parser for `path`: a claimed route's; else the longest claimed suffix the path
        ends with; else the fallback; else None (the request is refused)."""
        parser = self._served.get(path)
        if parser is not None:
            return parser
        try:
            return self._cache[path]
        except KeyError:
            pass
        suffix = longest_suffix(path, self._by_suffix)
        found = self._by_suffix[suffix] if suffix is not None else self.fallback
        if len(self._cache) < MAX_CACHED_PATHS:
            self._cache[path] = found
        return found
