"""Scorers: a score in [0, 1] per candidate pod, weighted per profile.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
