"""Prepare-data plugins: what a request carries before the producers run (token ids).

One module per plugin; heimdall_proxy/builtins.py is the one list of built-in types."""
