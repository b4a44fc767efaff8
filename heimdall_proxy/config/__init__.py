"""The config: loaded (gateway.py, flow.py, discovery.py), given llm-d's defaults (defaults.py),
validated and built into plugins (build.py) and a flow controller (flow_build.py); the server's
own options (options.py)."""
