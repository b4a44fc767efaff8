"""A scanner that pulls a few metric families out of a Prometheus text page without parsing
the rest of it.

A vLLM page is ~50 kB and ~460 samples, almost all histogram buckets the gateway never reads;
a full parse costs per line, so a scrape every 100 ms of hundreds of pods would take whole
cores. The scanner instead finds each wanted family's sample lines with `bytes.find` (C speed,
one pass per family) and parses only those lines: the metric name, the label set (quoted
values with the exposition format's escapes) and the value. Comment lines (`# HELP`,
`# TYPE`) never start with the family name, so they are skipped by construction; a family
whose name is a prefix of another one (`vllm:num_requests_waiting` and
`vllm:num_requests_waiting_by_reason`) is told apart by the byte after the name, which
cannot continue a metric name."""

from __future__ import annotations

from collections.abc import Iterable

#: One sample: its labels and value.
Sample = tuple[dict[str, str], float]

#: Bytes that may continue a metric name: after the family's name they mean another family.
NAME_BYTES = frozenset(
    bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:"
)

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


def _labels(line: str, start: int) -> tuple[dict[str, str], int]:
    """Parse `{k="v",...}` beginning at line[start] == "{"; return the labels and the index
    just past the closing brace. Raises ValueError on a malformed label set."""
    labels: dict[str, str] = {}
    i = start + 1
    n = len(line)
    while True:
        while i < n and line[i] in " ,":
            i += 1
        if i >= n:
            raise ValueError(f"unterminated label set: {line!r}")
        if line[i] == "}":
            return labels, i + 1
        eq = line.find("=", i)
        if eq < 0:
            raise ValueError(f"label without a value: {line!r}")
        key = line[i:eq].strip()
        if not key.replace("_", "a").isalnum() or line[eq + 1 : eq + 2] != '"':
            raise ValueError(f"malformed label {key!r}: {line!r}")
        i = eq + 2
        close = line.find('"', i)
        if close < 0:
            raise ValueError(f"unterminated label value: {line!r}")
        if "\\" not in line[i:close]:
            labels[key] = line[i:close]
            i = close + 1
            continue
        # The slow path, for values with escapes: walk character by character.
        out: list[str] = []
        while True:
            if i >= n:
                raise ValueError(f"unterminated label value: {line!r}")
            c = line[i]
            if c == "\\":
                nxt = line[i + 1 : i + 2]
                out.append(_ESCAPES.get(nxt, "\\" + nxt))
                i += 2
            elif c == '"':
                i += 1
                break
            else:
                out.append(c)
                i += 1
        labels[key] = "".join(out)


def parse_sample(line: str, name_len: int) -> Sample:
    """Parse one sample line whose metric name is `line[:name_len]`. Raises ValueError."""
    labels: dict[str, str] = {}
    rest = name_len
    if line[rest : rest + 1] == "{":
        labels, rest = _labels(line, rest)
    fields = line[rest:].split()
    if not fields or len(fields) > 2:
        raise ValueError(f"want a value and an optional timestamp: {line!r}")
    return labels, float(fields[0])


def scan_families(page: bytes, families: Iterable[str]) -> dict[str, list[Sample]]:
    """The samples of each family in `families` found on `page` (a family absent from the
    page is absent from the result). Only plain samples named exactly like the family are
    read: a histogram's `_bucket`/`_sum` lines are not. Raises ValueError on a malformed
    sample line of a wanted family; lines of other families are never looked at."""
    found: dict[str, list[Sample]] = {}
    for family in families:
        name = family.encode()
        needle = b"\n" + name
        samples: list[Sample] = []
        if page.startswith(name):
            start = 0
        else:
            hit = page.find(needle)
            start = hit + 1 if hit >= 0 else -1
        while start >= 0:
            after = page[start + len(name) : start + len(name) + 1]
            if after not in NAME_BYTES:
                end = page.find(b"\n", start)
                raw = page[start:] if end < 0 else page[start:end]
                samples.append(parse_sample(raw.decode("utf-8"), len(name)))
            hit = page.find(needle, start)
            start = hit + 1 if hit >= 0 else -1
        if samples:
            found[family] = samples
    return found
