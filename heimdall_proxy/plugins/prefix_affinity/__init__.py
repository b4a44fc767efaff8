"""The prefix-cache affinity filter and its decision trace."""
