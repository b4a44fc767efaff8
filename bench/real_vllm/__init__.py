"""Real vLLM CPU pods for the end-to-end tests and for trying the gateway by hand (README.md)."""
