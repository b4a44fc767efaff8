"""The plugin reference (docs/plugins.md) is generated from the code; CI fails when the
checked-in page and the code disagree."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import Field

from heimdall_proxy.cli.main import main
from heimdall_proxy.framework.base import BasePlugin
from heimdall_proxy.framework.params import Duration, PluginParams
from heimdall_proxy.framework.plugins import EXTENSION_POINTS
from heimdall_proxy.framework.registry import Registry, register
from heimdall_proxy.plugins.builtins import load_builtin_plugins, origin
from heimdall_proxy.plugins.reference import (
    COMMAND,
    SECTION_PRIORITY,
    SECTIONS,
    class_extension_points,
    format_duration,
    plugin_reference,
)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def test_the_checked_in_reference_matches_the_code() -> None:
    expected = plugin_reference(load_builtin_plugins(), origin)
    actual = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert actual == expected, f"docs/plugins.md is out of date with the code: run {COMMAND}"


def test_every_extension_point_has_a_section() -> None:
    """A new extension point needs its place on the page (SECTIONS, SECTION_PRIORITY)."""
    in_sections = {point for _, points in SECTIONS for point in points}
    assert set(EXTENSION_POINTS) == in_sections == set(SECTION_PRIORITY)


def test_every_registered_type_has_an_entry() -> None:
    page = plugin_reference(load_builtin_plugins(), origin)
    for spec in load_builtin_plugins():
        assert f"`{spec.type_name}`" in page, spec.type_name


class _Nested(PluginParams):
    #: The inner value.
    inner: int = 3


class _Params(PluginParams):
    #: How long to wait,
    #: on two lines.
    wait_time: Duration = Field(default=0.02, gt=0)
    # a plain comment is not documentation
    label: str = "x"
    nested: _Nested = Field(default_factory=_Nested)
    old_key: str | None = Field(default=None, deprecated="use label")


@register("toy-scorer", _Params)
class _Toy(BasePlugin[_Params]):
    """Scores every pod 1."""

    type = "toy-scorer"

    def score(self, state: object, request: object, endpoints: list[object]) -> dict[str, float]:
        return {}


def test_a_plugin_renders_its_doc_points_and_parameters() -> None:
    page = plugin_reference(Registry().add(_Toy))
    assert "### toy-scorer\n\nScores every pod 1.\n\n- Extension points: Scorer\n" in page
    assert "| `waitTime` | duration, > 0 | `20ms` | How long to wait, on two lines. |" in page
    assert '| `label` | string | `"x"` |  |' in page
    assert "| `nested` | [_Nested](#_nested) | its defaults |  |" in page
    assert "| `oldKey` | string | unset | **Deprecated.** use label |" in page
    assert "| `inner` | integer | `3` | The inner value. |" in page
    assert page == plugin_reference(Registry().add(_Toy))
    assert class_extension_points(_Toy) == ["Scorer"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0"), (0.02, "20ms"), (2.0, "2s"), (600.0, "10m"), (86400.0, "24h"), (1.5, "1500ms")],
)
def test_durations_are_written_as_go_durations(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_the_command_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plugins.md"
    assert main(["plugin-reference", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == plugin_reference(load_builtin_plugins(), origin)
    assert main(["plugin-reference"]) == 0
    assert capsys.readouterr().out == out.read_text(encoding="utf-8")


def test_each_type_says_where_it_comes_from() -> None:
    """The seeds' and llm-d's types as their documents name them; the rest are ours. A name
    in either list that is no registered type is a stale list."""
    from heimdall_proxy.plugins.builtins import LLMD_TYPES, SEED_TYPES

    types = set(load_builtin_plugins().types())
    assert types >= SEED_TYPES and types >= LLMD_TYPES
    assert origin("queue-scorer") == "seed, llm-d"
    assert origin("predicted-latency-scorer") == "seed"
    assert origin("anthropic-parser") == "llm-d"
    assert origin("outstanding-work-scorer") == "ours"
    page = plugin_reference(load_builtin_plugins(), origin)
    assert "| [`outstanding-work-scorer`](#outstanding-work-scorer) | Scorers | " in page
    assert "- Origin: ours" in page
