from spanlm.cli import main

raise SystemExit(main())
