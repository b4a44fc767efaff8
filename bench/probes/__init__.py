"""One-off probes: measurements that answered one question once (a cost split into its parts,
an instruction or call count, a trace analysis), kept so they can be rerun. Each is run as
`python -m bench.probes.<name>` from the checkout's root."""
