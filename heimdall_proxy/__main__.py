from heimdall_proxy.cli import main

raise SystemExit(main())
