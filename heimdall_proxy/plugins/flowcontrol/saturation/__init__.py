"""Saturation detectors: when the pool is full, for flow control."""
