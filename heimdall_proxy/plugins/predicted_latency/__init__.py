"""Latency-predicted scheduling: the producer that predicts TTFT and TPOT per pod, its scorers,
the SLO headroom filter and admitter, and the online models behind them."""
