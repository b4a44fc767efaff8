"""PageScanner (datalayer/rescan.py) against scan_families (scan.py), the scanner that reads
every page afresh: the same samples on the real vLLM page, on that page as its values change
from scrape to scrape, and on random grouped pages with families that come and go."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from heimdall_proxy.datalayer.rescan import WINDOW, PageScanner
from heimdall_proxy.datalayer.scan import Sample, scan_families
from heimdall_proxy.datalayer.vllm_metrics import (
    ALL_FAMILIES,
    KV_USAGE,
    KV_USAGE_LEGACY,
    STAND_INS,
    metrics_from_families,
    stand_ins,
)

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics_real.txt"


def _same(found: dict[str, list[Sample]]) -> dict[str, list[tuple[dict[str, str], str]]]:
    """Comparable samples: NaN equals NaN."""
    return {k: [(labels, repr(v)) for labels, v in samples] for k, samples in found.items()}


def _families_of(page: bytes) -> set[str]:
    """Every sample name on the page (the scanners' families are sample names)."""
    out = set()
    for line in page.decode().splitlines():
        if line and not line.startswith("#"):
            out.add(line.split("{", 1)[0].split(" ", 1)[0])
    return out


def test_the_real_page_scans_as_the_one_shot_scanner_reads_it() -> None:
    page = FIXTURE.read_bytes()
    families = _families_of(page) | ALL_FAMILIES | {"vllm:absent", "vllm:num_requests"}
    scanner = PageScanner(families)
    want = scan_families(page, families)
    assert len(want) > 100
    assert scanner.scan(page) == want
    assert scanner.scan(page) == want  # again, from the offsets and the parsed lines


def _shifted(page: bytes, rng: random.Random) -> bytes:
    """The page with every value rewritten at a random length, as a pod's next page."""
    out = []
    for line in page.split(b"\n"):
        if line and not line.startswith(b"#"):
            head, _ = line.rsplit(b" ", 1)
            value = rng.choice([b"0.0", b"1.0", b"12345678.5", b"2", b"NaN", b"1e+06"])
            line = head + b" " + value
        out.append(line)
    return b"\n".join(out)


def test_the_real_page_scrape_after_scrape() -> None:
    rng = random.Random(7)
    page = FIXTURE.read_bytes()
    families = _families_of(page) | ALL_FAMILIES
    scanner = PageScanner(families)
    for _ in range(30):
        page = _shifted(FIXTURE.read_bytes(), rng)
        assert _same(scanner.scan(page)) == _same(scan_families(page, families))


#: Families whose names share prefixes; no name is another family's sample name (`a_sum`
#: of `a`), which clients refuse to register.
_NAMES = ["a", "a_b", "a_bc", "ab", "x:y", "x:y_info", "zz", "q"]


def _label_value(rng: random.Random) -> str:
    return "".join(rng.choice(['a', '1', ' ', ',', '}', '{', '=', '\\\\', '\\"', '\\n'])
                   for _ in range(rng.randint(0, 6)))  # fmt: skip


def _family_lines(name: str, rng: random.Random) -> list[str]:
    """One family's group: its comments, then samples; a summary's samples interleave
    `name{...}` lines with `name_sum`/`name_count` lines, as Go's client writes them."""
    kind = rng.choice(["gauge", "counter", "histogram", "summary"])
    lines = [f"# HELP {name} help text {name}", f"# TYPE {name} {kind}"]
    for i in range(rng.randint(0, 4)):
        labels = "" if rng.random() < 0.3 else f'{{k="{i}",v="{_label_value(rng)}"}}'
        value = rng.choice(["0", "1.5", "-2", "NaN", "+Inf", "3e-05"])
        if kind == "counter":
            lines.append(f"{name}_total{labels} {value}")
        elif kind == "histogram":
            lines += [f'{name}_bucket{{le="1"}} {value}', f"{name}_sum {value}"]
        elif kind == "summary":
            lines += [f"{name}{labels} {value}", f"{name}_sum{labels} 1", f"{name}_count 2"]
        else:
            lines.append(f"{name}{labels} {value}" + (" 1700000000" if rng.random() < 0.2 else ""))
    return lines


def _random_page(rng: random.Random) -> bytes:
    names = rng.sample(_NAMES, rng.randint(0, len(_NAMES)))
    lines: list[str] = []
    for name in names:
        lines += _family_lines(name, rng)
        if rng.random() < 0.2:  # filler that moves the later families by a window or more
            lines += [f"filler_{len(lines)} 1"] * rng.randint(1, WINDOW // 8)
    return ("\n".join(lines) + ("\n" if rng.random() < 0.8 else "")).encode()


@pytest.mark.parametrize("seed", range(40))
def test_random_pages_scan_as_the_one_shot_scanner_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    wanted = set(rng.sample(_NAMES, 5)) | {"x:y_total", "q_sum"}
    scanner = PageScanner(wanted)
    for _ in range(15):
        page = _random_page(rng)
        assert _same(scanner.scan(page)) == _same(scan_families(page, wanted)), page


def test_a_malformed_sample_line_of_a_wanted_family_raises() -> None:
    scanner = PageScanner(["m"])
    assert scanner.scan(b"m 1\n") == {"m": [({}, 1.0)]}
    with pytest.raises(ValueError, match="unterminated label value"):
        scanner.scan(b'm{a="1 1\n')


def test_a_stand_in_is_read_only_when_its_page_lacks_what_it_stands_in_for() -> None:
    new, old = b"vllm:kv_cache_usage_perc 0.5\n", b"vllm:gpu_cache_usage_perc 0.25\n"
    scanner = PageScanner(ALL_FAMILIES, STAND_INS)
    assert scanner.scan(new + old) == {KV_USAGE: [({}, 0.5)]}
    assert scanner.scan(old) == {KV_USAGE_LEGACY: [({}, 0.25)]}
    assert PageScanner(ALL_FAMILIES).scan(new + old) == scan_families(new + old, ALL_FAMILIES)
    # What metrics_from_families makes of it is what it makes of the whole page's families.
    for page in (new + old, old, new):
        assert metrics_from_families(scanner.scan(page), 1.0) == metrics_from_families(
            scan_families(page, ALL_FAMILIES), 1.0
        )


def test_a_stand_in_a_plugin_reads_is_always_read() -> None:
    class Reader:
        metric_families = frozenset({KV_USAGE_LEGACY})

    assert stand_ins([]) == STAND_INS
    assert stand_ins([Reader()]) == {}
