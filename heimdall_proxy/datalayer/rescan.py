"""One pod's pages, scanned again and again: where each family was on the last page is where
it is looked for first, and sample lines unchanged since the last page are not parsed again.

scan.py's `scan_families` reads a page it has never seen: for each family it searches the
whole ~50 kB page (`bytes.find` to the end, since a family's samples could be anywhere),
about 110 µs a scrape of which almost all is those searches, and it parses every sample
line again, the ~30-label `vllm:cache_config_info` line included. Successive pages of one
pod differ only in values: the families keep their order and move by a few bytes when a
value earlier on the page changes length. So `PageScanner` looks for a family's first
sample first in a window around where it was, then reads only the family's group: the
exposition format writes a family's lines together after its `# HELP`/`# TYPE` comments,
so every sample of the family lies between the comments of the family before it and
those of the family after it (a Go summary's `x{...}`, `x_sum`, `x_count` interleaved
included). A family not in the window is searched for from the page's start; an absent
one costs one search of the page, as in scan.py; a page without comments is one group.
On any page where each family's lines are grouped, as the format requires, the result
equals `scan_families`'s (tests/datalayer/test_rescan.py checks it on the real vLLM page
and on random pages)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from heimdall_proxy.datalayer.scan import NAME_BYTES, Sample, parse_sample

#: How far (bytes) either side of its last offset a family is looked for before the whole
#: page is searched: values earlier on the page change length by a few bytes per scrape.
WINDOW = 2048


class PageScanner:
    """Scans the successive pages of one pod for a fixed set of families. The samples it
    returns may be the very objects it returned for an earlier page (an unchanged line is
    not parsed again): readers must not mutate them."""

    def __init__(self, families: Iterable[str], stand_ins: Mapping[str, str] | None = None) -> None:
        """`stand_ins` (family -> the family it stands in for): those of `families` looked
        for only when the page has no sample of the family they stand in for."""
        wanted = set(families)
        self._stand_ins = {f: p for f, p in (stand_ins or {}).items() if f in wanted}
        order = sorted(wanted, key=lambda f: (f in self._stand_ins, f))
        self._names = [(f, f.encode(), b"\n" + f.encode()) for f in order]
        #: family -> offset of its first sample line on the last page.
        self._where: dict[str, int] = {}
        #: The last page's sample lines, parsed.
        self._parsed: dict[bytes, Sample] = {}

    def scan(self, page: bytes) -> dict[str, list[Sample]]:
        """The samples of each family found on `page`, as `scan_families(page, families)`
        returns them. Raises ValueError on a malformed sample line of a wanted family."""
        found: dict[str, list[Sample]] = {}
        last = self._parsed
        parsed: dict[bytes, Sample] = {}
        for family, name, needle in self._names:
            primary = self._stand_ins.get(family)
            if primary is not None and primary in found:
                continue
            hint = self._where.get(family, -1)
            hit = -1
            if hint >= 0:
                hit = _first_sample(page, name, max(0, hint - WINDOW), hint + WINDOW)
                if hit >= 0:  # the family may start before the window: from its group's start
                    earlier = _first_sample(page, name, _group_start(page, name, hit), hit)
                    hit = earlier if earlier >= 0 else hit
            if hit < 0:
                hit = _first_sample(page, name, 0, len(page))
                if hit < 0:
                    self._where.pop(family, None)
                    continue
            self._where[family] = hit
            samples: list[Sample] = []
            n = len(name)
            end = _group_end(page, name, hit)
            at: int = hit
            while 0 <= at < end:
                if page[at + n : at + n + 1] not in NAME_BYTES:
                    stop = page.find(b"\n", at)
                    raw = page[at:] if stop < 0 else page[at:stop]
                    sample = last.get(raw)
                    if sample is None:
                        sample = parse_sample(raw.decode("utf-8"), n)
                    parsed[raw] = sample
                    samples.append(sample)
                at = page.find(needle, at, end)
                at = at + 1 if at >= 0 else -1
            if samples:
                found[family] = samples
        self._parsed = parsed
        return found


#: What a sample's name may add to its family's (`x_total` of counter `x`).
_SUFFIXES = (b"", b"_total", b"_created", b"_sum", b"_count", b"_bucket", b"_info", b"_gsum",
             b"_gcount")  # fmt: skip


def _foreign_comment(page: bytes, at: int, name: bytes) -> bool:
    """The line at `at` is a `# HELP` or `# TYPE` line of a family that `name` is no sample
    of: a group boundary for `name`."""
    if not page.startswith((b"# HELP ", b"# TYPE "), at):
        return False
    stop = page.find(b"\n", at)
    family = (page[at + 7 :] if stop < 0 else page[at + 7 : stop]).split(b" ", 1)[0]
    return not (name.startswith(family) and name[len(family) :] in _SUFFIXES)


def _group_start(page: bytes, name: bytes, hit: int) -> int:
    """Where the group of the sample line at `hit` starts: just after the last comment line
    before it that belongs to another family, or the page's start."""
    at = hit
    while at > 0:
        at = page.rfind(b"\n#", 0, at - 1)
        if at < 0:
            return 0
        if _foreign_comment(page, at + 1, name):
            return at + 1
    return 0


def _group_end(page: bytes, name: bytes, hit: int) -> int:
    """Where the group of the sample line at `hit` ends: the first comment line after it
    that belongs to another family, or the page's end. A family's first sample line is its
    group's first sample line, so only the end is looked for."""
    at = hit
    while True:
        at = page.find(b"\n#", at)
        if at < 0:
            return len(page)
        at += 1
        if _foreign_comment(page, at, name):
            return at


def _first_sample(page: bytes, name: bytes, lo: int, hi: int) -> int:
    """The offset of the first sample line of exactly `name` starting in [lo, hi), or -1."""
    n = len(name)
    if lo == 0 and page.startswith(name) and page[n : n + 1] not in NAME_BYTES:
        return 0
    needle = b"\n" + name
    at = lo - 1 if lo > 0 else 0
    while True:
        hit = page.find(needle, at, hi + n + 1)
        if hit < 0:
            return -1
        if page[hit + 1 + n : hit + 2 + n] not in NAME_BYTES:
            return hit + 1
        at = hit + 1
