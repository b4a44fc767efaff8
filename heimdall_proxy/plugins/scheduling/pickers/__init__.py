"""Pickers: the pod(s) a profile chooses from the scores.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
