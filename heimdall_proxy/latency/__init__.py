"""Latency prediction: an online model of TTFT and TPOT per candidate pod, and what the
latency-aware plugins share through the CycleState. See README.md beside this file."""
