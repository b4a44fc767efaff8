"""The plugin reference (docs/plugins.md), generated from the code: for every type in a
registry, its docstring, the extension points its class implements and a table of its
parameters from its pydantic model (config key, type, default, and the field's `#:` comment).

`heimdall-proxy plugin-reference --out docs/plugins.md` writes it; a test checks that the
checked-in page matches the code."""

from __future__ import annotations

import ast
import inspect
import json
import re
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

from heimdall_proxy.framework import plugins as contracts
from heimdall_proxy.framework.params import Duration, PluginParams, Quantity
from heimdall_proxy.framework.registry import PluginSpec, Registry

#: The page's sections in the order a request meets them: (title, the extension points whose
#: plugins it lists). A plugin is listed once, under the first point of SECTION_PRIORITY it
#: implements; the index at the top lists every point it implements.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Parsers", ("Parser",)),
    ("Request-header plugins", ("RequestHeader",)),
    ("Data preparation and producers", ("PrepareData", "Producer", "LoadEstimator")),
    ("Admitters", ("Admitter",)),
    ("Profile handlers and deciders", ("ProfileHandler", "Decider")),
    ("Filters", ("Filter",)),
    ("Scorers", ("Scorer",)),
    ("Pickers", ("Picker",)),
    (
        "Request-control hooks",
        ("PreRequest", "ResponseReceived", "ResponseStreaming", "ResponseComplete"),
    ),
    (
        "Flow control",
        ("SaturationDetector", "FairnessPolicy", "OrderingPolicy", "UsageLimitPolicy"),
    ),
    ("Data layer", ("DataSource", "DataExtractor", "EndpointExtractor")),
    ("Stores", ("ResponsesStore",)),
)

#: Which section a plugin that implements several points goes to: the most specific point
#: first (a saturation detector is also a filter, a scorer that produces is still a scorer).
SECTION_PRIORITY: tuple[str, ...] = (
    "Parser",
    "SaturationDetector",
    "FairnessPolicy",
    "OrderingPolicy",
    "UsageLimitPolicy",
    "ProfileHandler",
    "Decider",
    "ResponsesStore",
    "DataSource",
    "DataExtractor",
    "Picker",
    "Scorer",
    "Filter",
    "Admitter",
    "Producer",
    "LoadEstimator",
    "RequestHeader",
    "PrepareData",
    "PreRequest",
    "ResponseReceived",
    "ResponseStreaming",
    "ResponseComplete",
    "EndpointExtractor",
)

#: Capabilities that are not extension points but change how a plugin lives in the gateway.
CAPABILITIES: dict[str, tuple[type, str]] = {
    "Lifecycle": (
        contracts.Lifecycle,
        "runs background work (started and stopped with the gateway)",
    ),
    "Inherits": (contracts.Inherits, "keeps its learned state across a config reload"),
    "MetricsSource": (contracts.MetricsSource, "exports metrics of its own on `/metrics`"),
    "ChecksPeers": (contracts.ChecksPeers, "checks the plugins its parameters name"),
}

COMMAND = "heimdall-proxy plugin-reference --out docs/plugins.md"

_DURATION_CHECK = typing.get_args(Duration)[1]
_QUANTITY_CHECK = typing.get_args(Quantity)[1]
_SCALARS: dict[object, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    Any: "any",
    object: "any",
    SecretStr: "secret string",
}


def protocol_methods(proto: type) -> list[str]:
    """The methods a Protocol declares (its data members are not checked: a class may set
    them per instance)."""
    return sorted(
        name
        for name, value in vars(proto).items()
        if not name.startswith("_") and inspect.isfunction(value)
    )


def implements(cls: type, proto: type) -> bool:
    methods = protocol_methods(proto)
    return bool(methods) and all(callable(getattr(cls, m, None)) for m in methods)


def class_extension_points(cls: type) -> list[str]:
    """The extension points (names of `framework.plugins.EXTENSION_POINTS`) a plugin class
    implements, in that table's order."""
    return [name for name, proto in contracts.EXTENSION_POINTS.items() if implements(cls, proto)]


def class_capabilities(cls: type) -> list[str]:
    return [name for name, (proto, _) in CAPABILITIES.items() if implements(cls, proto)]


def section_of(points: Iterable[str]) -> str:
    have = set(points)
    for point in SECTION_PRIORITY:
        if point in have:
            return next(title for title, members in SECTIONS if point in members)
    return "Other"


# --- the parameter tables ---------------------------------------------------------------


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> its `#:` comment (the lines right above it in the class body), for the
    model and its bases. Plain `#` comments are not documentation and are left out."""
    out: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass in (
            BaseModel,
            PluginParams,
        ):
            continue
        try:
            lines, _ = inspect.getsourcelines(klass)
        except (OSError, TypeError):
            continue
        tree = ast.parse(textwrap.dedent("".join(lines)))
        node = tree.body[0]
        if not isinstance(node, ast.ClassDef):
            continue
        for stmt in node.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            doc: list[str] = []
            row = stmt.lineno - 2  # the line above, 0-based
            while row >= 0 and lines[row].strip().startswith("#:"):
                doc.insert(0, lines[row].strip()[2:].strip())
                row -= 1
            if doc:
                out[stmt.target.id] = " ".join(doc)
    return out


def _checks(metadata: Iterable[object]) -> tuple[str | None, list[str]]:
    """(a special type name: duration or quantity, the bounds) from a field's metadata."""
    special: str | None = None
    bounds: list[str] = []
    for item in metadata:
        if item is _DURATION_CHECK:
            special = "duration"
        elif item is _QUANTITY_CHECK:
            special = "quantity"
        elif isinstance(item, annotated_types.Gt):
            bounds.append(f"> {_number(item.gt)}")
        elif isinstance(item, annotated_types.Ge):
            bounds.append(f"≥ {_number(item.ge)}")
        elif isinstance(item, annotated_types.Lt):
            bounds.append(f"< {_number(item.lt)}")
        elif isinstance(item, annotated_types.Le):
            bounds.append(f"≤ {_number(item.le)}")
        elif isinstance(item, annotated_types.MinLen) and item.min_length > 0:
            bounds.append(f"at least {item.min_length} long")
        elif isinstance(item, annotated_types.MaxLen):
            bounds.append(f"at most {item.max_length} long")
    return special, bounds


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, int) and value >= 1 << 32 and value & (value - 1) == 0:
        return f"2^{value.bit_length() - 1}"
    return str(value)


class _Types:
    """Renders annotations as users read them. The nested models they name each get a table
    under "Parameter types", titled by class name, or, when two classes share a name, by
    name and the first plugin type (by name) that uses it."""

    def __init__(self, registry: Registry) -> None:
        first_user: dict[type[BaseModel], str] = {}
        for spec in sorted(registry, key=lambda s: s.type_name):
            for model in _nested_models(spec.params):
                first_user.setdefault(model, spec.type_name)
        counts: dict[str, int] = {}
        for model in first_user:
            counts[model.__name__] = counts.get(model.__name__, 0) + 1
        self.models: dict[type[BaseModel], str] = {
            model: model.__name__ if counts[model.__name__] == 1 else f"{model.__name__} ({user})"
            for model, user in first_user.items()
        }

    def name(self, model: type[BaseModel]) -> str:
        return self.models[model]

    def render(self, annotation: Any) -> str:
        origin = typing.get_origin(annotation)
        args = typing.get_args(annotation)
        if origin is typing.Annotated:
            special, bounds = _checks(annotation.__metadata__)
            base = special or self.render(args[0])
            return ", ".join([base, *bounds])
        if origin in (typing.Union, types.UnionType):
            rest = [a for a in args if a is not type(None)]
            return " or ".join(self.render(a) for a in rest)
        if origin is Literal:
            return " or ".join(json.dumps(a) for a in args)
        if origin in (list, tuple, set, frozenset) or origin is typing.Sequence:
            return f"list of {self.render(args[0])}" if args else "list"
        if origin is dict or origin is typing.Mapping:
            return f"map of {self.render(args[1])}" if args else "map"
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            name = self.name(annotation)
            return f"[{name}](#{_anchor(name)})"
        if annotation in _SCALARS:
            return _SCALARS[annotation]
        return str(getattr(annotation, "__name__", annotation))

    def field_type(self, info: FieldInfo) -> str:
        special, bounds = _checks(info.metadata)
        base = special or self.render(info.annotation)
        return ", ".join([base, *bounds])


def _is_model(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _nested_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    """The models `model`'s fields name, and those they name, depth first."""
    out: list[type[BaseModel]] = []
    for info in model.model_fields.values():
        for nested in _models_in(info.annotation):
            if nested not in out:
                out.append(nested)
                out += [m for m in _nested_models(nested) if m not in out]
    return out


def format_duration(seconds: float) -> str:
    """Seconds as the Go duration string a user would write ("20ms", "2s", "10m")."""
    if seconds == 0:
        return "0"
    for unit, size in (("h", 3600.0), ("m", 60.0), ("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        count = seconds / size
        if abs(seconds) >= size and abs(count - round(count)) < 1e-9:
            return f"{round(count)}{unit}"
    return f"{round(seconds * 1e9)}ns"


def field_default(info: FieldInfo, is_duration: bool) -> str:
    if info.is_required():
        return "required"
    value = info.default
    factory = info.default_factory
    if value is PydanticUndefined and factory is not None:
        # A model or an empty container is the same everywhere; any other factory computes
        # its value where the gateway runs (the description says how).
        if not (factory in (dict, list, set, tuple) or _is_model(factory)):
            return "computed"
        value = factory()  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        return "its defaults"
    if value is None:
        return "unset"
    if is_duration and isinstance(value, int | float) and not isinstance(value, bool):
        return f"`{format_duration(float(value))}`"
    if isinstance(value, float):
        return f"`{_number(value)}`"
    if isinstance(value, set | frozenset):
        value = sorted(value)  # a set's order changes from run to run
    if isinstance(value, SecretStr):
        return "secret" if value.get_secret_value() else "unset"
    return f"`{json.dumps(to_jsonable_python(value), sort_keys=True)}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def params_table(model: type[BaseModel], kinds: _Types) -> list[str]:
    """The markdown table of a parameter model's fields, in declaration order."""
    comments = field_comments(model)
    rows = ["| Key | Type | Default | Description |", "| --- | --- | --- | --- |"]
    for attr, info in model.model_fields.items():
        key = info.alias or attr
        kind = kinds.field_type(info)
        is_duration = _checks(info.metadata)[0] == "duration"
        doc = info.description or comments.get(attr, "")
        if info.deprecated:
            message = info.deprecated if isinstance(info.deprecated, str) else ""
            doc = f"**Deprecated.** {message} {doc}".strip()
        default = field_default(info, is_duration)
        rows.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | {_cell(doc)} |")
    return rows


# --- the page -----------------------------------------------------------------------------


def _anchor(title: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return text.replace(" ", "-")


def summary(spec: PluginSpec, primary: str) -> str:
    """What the plugin does: its module's docstring when the module is about it (the text
    before the docstring's first colon names the type), less that name, then the class
    docstring."""
    parts: list[str] = []
    module = inspect.getmodule(spec.factory)
    module_doc = inspect.cleandoc(module.__doc__ or "") if module is not None else ""
    head, colon, rest = module_doc.partition(":")
    if colon and re.search(rf"(^|[\s,`]){re.escape(primary)}([\s,`(]|$)", head):
        rest = rest.strip()
        parts.append(rest[:1].upper() + rest[1:])
    class_doc = spec.factory.__dict__.get("__doc__")
    if class_doc:
        parts.append(inspect.cleandoc(class_doc))
    return "\n\n".join(parts) or "(no description in the code)"


def _primary(spec: PluginSpec) -> str:
    """The type name the class was declared with (its first spec); others are aliases."""
    specs: tuple[PluginSpec, ...] = spec.factory.__dict__.get("__plugin_specs__", (spec,))
    return specs[0].type_name


def plugin_reference(
    registry: Registry, origin: Callable[[str], str] = lambda type_name: ""
) -> str:
    """The reference page for every plugin type in `registry`, as markdown. Deterministic:
    types sorted by name within fixed sections. `origin` says where a type comes from (the
    composition root knows: plugins/builtins.py); by default the column is empty."""
    kinds = _Types(registry)
    entries: dict[str, list[PluginSpec]] = {}  # primary type name -> its specs, aliases after
    for spec in registry:
        entries.setdefault(_primary(spec), []).append(spec)
    by_section: dict[str, list[tuple[str, list[str]]]] = {}
    for primary in sorted(entries):
        cls = entries[primary][0].factory
        if not isinstance(cls, type):
            raise TypeError(f"plugin type {primary!r}: the reference needs a class factory")
        points = class_extension_points(cls)
        by_section.setdefault(section_of(points), []).append((primary, points))

    out = [
        "<!-- Generated from the code by `" + COMMAND + "`; do not edit by hand. -->",
        "",
        "# Plugin reference",
        "",
        "Every built-in plugin type: what it does (its docstring), the extension points it",
        "implements, and its parameters. Declare a plugin in the config's `plugins` list and name",
        "it in a scheduling profile:",
        "",
        "```yaml",
        "plugins:",
        "- type: load-aware-scorer     # the type, as below",
        "  name: load                  # optional; defaults to the type",
        "  parameters:",
        "    threshold: 64             # the keys of the type's table",
        "schedulingProfiles:",
        "- name: default",
        "  plugins:",
        "  - pluginRef: load",
        "    weight: 2",
        "```",
        "",
        "Parameter keys are camelCase as in Heimdall and llm-d; a key the type does not know is",
        "logged and ignored. A duration is a Go duration string (`500ms`, `2s`, `1h30m`); a",
        'quantity a Kubernetes one (`100`, `5k`, `1Gi`). "Unset" means the parameter is off or',
        "derived from others (see the description). A plugin with a feature gate is built only",
        "when the config's `featureGates` lists it.",
        "",
        "Besides its extension points, the facts under a plugin may say that it has:",
        "",
        *(f"- {name}: it {text}." for name, (_, text) in CAPABILITIES.items()),
        "",
        "## Index",
        "",
        "Origin: the seeds (Heimdall's plugin set), llm-d's router (llm-d/llm-d-router), or",
        "this project's own.",
        "",
        "| Type | Section | Extension points | Origin |",
        "| --- | --- | --- | --- |",
    ]
    section_titles = [title for title, _ in SECTIONS] + ["Other"]
    index: list[tuple[str, str]] = []
    for title in section_titles:
        for primary, points in by_section.get(title, []):
            row = f"| [`{primary}`](#{_anchor(primary)}) | {title} | "
            row += (", ".join(points) or "(none)") + f" | {origin(primary)} |"
            index.append((primary, row))
        for primary, _ in by_section.get(title, []):
            for alias in entries[primary][1:]:
                name = alias.type_name
                index.append((name, f"| `{name}` | alias of `{primary}` | | {origin(name)} |"))
    out.extend(row for _, row in sorted(index))

    for title in section_titles:
        listed = by_section.get(title, [])
        if not listed:
            continue
        out += ["", f"## {title}"]
        for primary, points in listed:
            specs = entries[primary]
            spec = specs[0]
            cls = spec.factory
            assert isinstance(cls, type)
            out += ["", f"### {primary}", "", summary(spec, primary), ""]
            facts = [f"- Extension points: {', '.join(points) or '(none)'}"]
            if origin(primary):
                facts.append(f"- Origin: {origin(primary)}")
            also = class_capabilities(cls)
            if also:
                facts.append(f"- Also: {', '.join(also)}")
            aliases = [s.type_name for s in specs[1:]]
            if aliases:
                facts.append(f"- Aliases: {', '.join(f'`{a}`' for a in sorted(aliases))}")
            if spec.feature_gate:
                facts.append(f"- Feature gate: `{spec.feature_gate}`")
            out += facts
            if spec.params.model_fields:
                out += ["", "Parameters:", "", *params_table(spec.params, kinds)]
            else:
                out += ["", "No parameters."]

    out += _model_sections(kinds)
    return "\n".join(out) + "\n"


def _model_sections(kinds: _Types) -> list[str]:
    """One table per nested parameter model the plugin tables name."""
    if not kinds.models:
        return []
    out = ["", "## Parameter types", "", "Nested parameter objects named in the tables above."]
    for model, name in sorted(kinds.models.items(), key=lambda item: item[1]):
        out += ["", f"### {name}", ""]
        doc = model.__dict__.get("__doc__")
        if doc:
            out += [inspect.cleandoc(doc), ""]
        out += params_table(model, kinds)
    return out
