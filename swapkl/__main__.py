from swapkl.cli import main

raise SystemExit(main())
