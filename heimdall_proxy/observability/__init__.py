"""What the gateway shows of itself: its Prometheus families (metrics.py), per-model series
(series.py), the event loop's cheap metric children (loop.py), logging set-up (logs.py) and
OpenTelemetry tracing (tracing.py)."""
