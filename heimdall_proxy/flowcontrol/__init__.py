"""Flow control's engine: the controller that holds and releases requests, its queues,
objectives and metrics (its policies are plugins under plugins/flowcontrol)."""
