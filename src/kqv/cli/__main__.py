"""`python -m kqv.cli`: the `kqv` command."""

from .main import main

raise SystemExit(main())
