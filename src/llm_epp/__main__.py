from llm_epp.cli import main

raise SystemExit(main())
