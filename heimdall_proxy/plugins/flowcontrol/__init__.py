"""Flow-control policies: which flow of a priority band goes next, and in what order a flow's
requests leave it."""
