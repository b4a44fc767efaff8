"""Scheduling filters: which candidate pods a profile keeps.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
