"""The family scanner against prometheus-client's full parser, on the real vLLM page."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from heimdall_proxy.datalayer.scan import scan_families

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics_real.txt"


def _reference(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every plain sample (named like its family) as the full parser reads it."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def test_every_family_of_the_real_page_matches_the_full_parser() -> None:
    text = FIXTURE.read_text()
    reference = _reference(text)
    found = scan_families(text.encode(), reference)
    assert found.keys() == reference.keys()
    for name, samples in reference.items():
        assert found[name] == samples, name


def test_escaped_label_values() -> None:
    text = 'm{a="x\\\\y",b="q\\"r",c="l1\\nl2",d="}{,"} 1.5\n'
    assert scan_families(text.encode(), ["m"]) == {
        "m": [({"a": "x\\y", "b": 'q"r', "c": "l1\nl2", "d": "}{,"}, 1.5)]
    }
    assert scan_families(text.encode(), ["m"]) == {
        k: [(dict(s[0]), s[1]) for s in v] for k, v in _reference(text).items()
    }


def test_prefix_families_are_told_apart() -> None:
    page = b'# TYPE a_b gauge\na_b 1\na_bc 2\na_b_bucket{le="1"} 3\na_b{x="1"} 4\n'
    assert scan_families(page, ["a_b", "a_bc", "a"]) == {
        "a_b": [({}, 1.0), ({"x": "1"}, 4.0)],
        "a_bc": [({}, 2.0)],
    }


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "1e+06"])
def test_special_values(value: str) -> None:
    ((_labels, got),) = scan_families(f"m {value}\n".encode(), ["m"])["m"]
    assert str(got) == str(float(value))
