from flashgen.cli import main

raise SystemExit(main())
