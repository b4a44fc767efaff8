"""A simulated vLLM pod: vLLM's OpenAI routes, /metrics, /tokenize and KV events in vLLM's own
shapes, in front of a continuous-batching engine model with a paged, prefix-cached KV cache,
LoRA slots and disaggregated prefill/decode/encode. Used by the tests, `heimdall-proxy demo`
and the benchmarks. See README.md in this directory."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heimdall_proxy.sim.options import SimOptions

if TYPE_CHECKING:
    from heimdall_proxy.sim.pod import SimPod

__all__ = ["SimOptions", "SimPod"]


def __getattr__(name: str) -> Any:
    # SimPod pulls in aiohttp, pyzmq and msgpack; the CLI only needs SimOptions to build its
    # parser, so the pod is imported on first use.
    if name == "SimPod":
        from heimdall_proxy.sim.pod import SimPod

        return SimPod
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
