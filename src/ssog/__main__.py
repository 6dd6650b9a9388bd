from ssog.cli import main

raise SystemExit(main())
