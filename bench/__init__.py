"""Benchmarks of heimdall-proxy, run from the checkout's root as `python -m bench.<name>`.

The modules at this level each answer a standing question (bench/RESULTS.md has the current
figure and the command for each); `bench.harness` holds what they share (pods, the gateway,
the peers, workloads, the runner, statistics, plots, options); `bench.probes` holds one-off
measurements kept for reruns. See bench/README.md.
"""
