"""Saturation detectors: judge a pool for the flow controller, and filter overfull pods."""
