from gpt2.cli import main

raise SystemExit(main())
