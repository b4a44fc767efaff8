"""Built-in plugins, one module each, grouped by the extension point they serve.
heimdall_proxy/plugins/builtins.py is the one list of them (it registers them)."""
