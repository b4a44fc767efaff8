"""The `heimdall-proxy` command line, one module per command (serve, demo, sim,
check-config, conductor, tokenizer-server, plugin-reference); main.py picks the command,
args.py holds what they share."""
