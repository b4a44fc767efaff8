"""Disaggregation deciders: whether a request takes a prefill or encode hop.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
