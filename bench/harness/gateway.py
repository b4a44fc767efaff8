"""The gateway under test: a config rewritten for the bench's pods, its command line and its
readiness (ready, every pod seen, the model listed)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.harness.pods import Pod
from bench.harness.procs import HOST, heimdall_cmd, http_get
from bench.harness.runner import parse_metrics


def gateway_config(doc: Mapping[str, Any], pods: Sequence[Pod]) -> dict[str, Any]:
    """A copy of a gateway config with its `endpoints:` replaced by `pods`.

    Everything else (the EndpointPickerConfig at the top level or under `config:`, feature
    gates, other keys) is kept as is. Pod i takes the labels of the config's endpoint
    i % len(endpoints), so label-based configs (roles, context-length ranges) keep their
    meaning, replicated over a larger fleet.
    """
    out = copy.deepcopy(dict(doc))
    old = out.get("endpoints") or []
    endpoints = []
    for i, pod in enumerate(pods):
        ep: dict[str, Any] = {"name": pod.name, "url": pod.url}
        src = old[i % len(old)] if old else None
        if isinstance(src, Mapping) and src.get("labels"):
            ep["labels"] = dict(src["labels"])
        if pod.kv_events_port is not None:
            ep["kvEvents"] = f"tcp://{HOST}:{pod.kv_events_port}"
        endpoints.append(ep)
    out["endpoints"] = endpoints
    return out


#: The label disaggregation filters read, and the roles `heimdall-proxy sim --role` takes.
ROLE_LABEL = "mif.moreh.io/role"
SIM_ROLES = ("both", "prefill", "decode", "encode")


def pod_roles(doc: Mapping[str, Any], n_pods: int) -> list[str | None]:
    """Each of `n_pods` pods' disaggregation role, from the label of the config's endpoint it
    stands for (i % len(endpoints), as `gateway_config` cycles them); None without one.

    An encode pod must run as one (`sim --role encode` serves only the encoder); prefill and
    decode pods act on kv_transfer_params whatever their role, but are started as labelled."""
    old = doc.get("endpoints") or []
    roles: list[str | None] = []
    for i in range(n_pods):
        src = old[i % len(old)] if old else None
        labels = src.get("labels") if isinstance(src, Mapping) else None
        role = labels.get(ROLE_LABEL) if isinstance(labels, Mapping) else None
        roles.append(role if role in SIM_ROLES else None)
    return roles


def profile_summary(doc: Mapping[str, Any]) -> str:
    """`profile: plugin xweight, ...` of a gateway config, for the record."""
    epp = doc.get("config") if isinstance(doc.get("config"), Mapping) else doc
    profiles = epp.get("schedulingProfiles") or []
    if not profiles:
        plugins = [str(p.get("type")) for p in epp.get("plugins") or [] if isinstance(p, Mapping)]
        return "default: " + (", ".join(plugins) or "(Heimdall defaults)")
    parts = []
    for prof in profiles:
        refs = []
        for ref in prof.get("plugins") or []:
            weight = ref.get("weight")
            refs.append(str(ref.get("pluginRef")) + (f" x{weight:g}" if weight is not None else ""))
        parts.append(f"{prof.get('name')}: {', '.join(refs)}")
    return "; ".join(parts)


def _identity(item: Any) -> tuple[str, Any] | None:
    if isinstance(item, dict):
        for key in ("name", "pluginRef", "type"):
            if key in item:
                return key, item[key]
    return None


def merge_config(base: Any, extra: Any) -> Any:
    """Merge ``extra`` into ``base``.

    Mappings merge key by key. Lists of mappings merge item by item on the item's identity (its
    ``name``, else ``pluginRef``, else ``type``); items of ``extra`` with no counterpart are
    appended. So an extra file holding just a ``plugins: [{type: prefix-cache-scorer}]`` entry and
    a ``schedulingProfiles: [{name: default, plugins: [{pluginRef: prefix-cache-scorer}]}]`` entry
    adds the scorer to the default profile. Anything else in ``extra`` replaces the base value.
    """
    if isinstance(base, dict) and isinstance(extra, dict):
        out = dict(base)
        for key, value in extra.items():
            out[key] = merge_config(base[key], value) if key in base else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(extra, list):
        merged = list(base)
        for item in extra:
            ident = _identity(item)
            index = next(
                (i for i, old in enumerate(merged) if ident and _identity(old) == ident), None
            )
            if index is None:
                merged.append(copy.deepcopy(item))
            else:
                merged[index] = merge_config(merged[index], item)
        return merged
    return copy.deepcopy(extra)


def serve_command(config_path: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    """`heimdall-proxy serve` on `config_path`, quiet, on HOST:`port`."""
    return [*heimdall_cmd(), *serve_args(config_path, port, extra)]


def serve_args(config_path: Path, port: int, extra: Sequence[str] = ()) -> list[str]:
    """The arguments after the gateway's executable (shared with a baseline tree's gateway)."""
    return [
        "serve",
        "--config",
        str(config_path),
        "--host",
        HOST,
        "--port",
        str(port),
        "--log-format",
        "text",
        "-v",
        "0",
        *extra,
    ]


def ready(url: str, n_pods: int, model: str) -> bool:
    """The gateway answers /ready, sees `n_pods` ready pods and lists `model`."""
    status, _ = http_get(url + "/ready")
    if status != 200:
        return False
    _, text = http_get(url + "/metrics")
    ready_pods = parse_metrics(text).get("inference_pool_ready_pods")
    if ready_pods is not None and ready_pods < n_pods:
        return False
    status, body = http_get(url + "/v1/models")
    return status == 200 and f'"{model}"' in body
