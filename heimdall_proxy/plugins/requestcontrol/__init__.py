"""Request-control hooks: headers and bookkeeping around each attempt.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
