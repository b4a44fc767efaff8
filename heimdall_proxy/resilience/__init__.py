"""Failure handling, together: the per-pod circuit breaker, outlier ejection and the retry
rules."""
