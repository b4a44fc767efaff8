"""The Responses API store (previous_response_id, GET/DELETE of stored responses).

One module per plugin; heimdall_proxy/plugins/builtins.py is the one list of built-in types."""
