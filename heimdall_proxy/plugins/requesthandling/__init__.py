"""Request handling plugins: the parsers that read each API's requests and answers."""
