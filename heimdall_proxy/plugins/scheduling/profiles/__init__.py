"""Profile handlers: which scheduling profiles run for a request, and how their results combine.

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
