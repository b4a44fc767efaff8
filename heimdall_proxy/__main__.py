from heimdall_proxy.cli import main

# Guarded: worker processes (spawned) import the main module again.
if __name__ == "__main__":
    raise SystemExit(main())
