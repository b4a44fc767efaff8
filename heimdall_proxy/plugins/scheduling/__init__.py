"""Scheduling plugins: filters, scorers, pickers, profile handlers and the disaggregation
deciders."""
