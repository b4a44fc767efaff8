from heimdall_proxy.cli.main import main

# Guarded: worker processes (spawned) import the main module again.
if __name__ == "__main__":
    raise SystemExit(main())
