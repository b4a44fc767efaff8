"""What the benchmarks share, one module per piece:

- `procs`: starting, watching and stopping subprocesses; free ports; readiness polls.
- `pods`: the simulated fleet (`heimdall-proxy sim`) and the fast stand-in upstream.
- `gateway`: the gateway under test (its config rewritten for the pods, command, readiness).
- `peers`: what it is compared with (vllm-router's policies, the bare forwarder).
- `targets`: a router in front of a fresh fleet, loaded with a workload.
- `workloads`: the deterministic request schedules; `runner`: the open-loop replay.
- `stats`: the one percentile and the pooled figures; `plots`: per-pod queue figures.
- `cli`: the options every benchmark takes the same way; `machine`: what a run records.

`fast_upstream` and `bare_forwarder` are servers run as subprocesses (`python -m`).
"""
