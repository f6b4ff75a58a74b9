from swapkl.commands.cli import main

raise SystemExit(main())
