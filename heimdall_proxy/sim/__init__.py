"""A simulated vLLM pod: the OpenAI routes, /metrics with vLLM's names, /v1/models, in vLLM's
own response shapes. Used by the tests, `heimdall-proxy demo` and the benchmarks."""

from heimdall_proxy.sim.pod import SimOptions, SimPod

__all__ = ["SimOptions", "SimPod"]
