"""`python -m app` is the same as the `gang-extender` console script."""

from app.cli import main

raise SystemExit(main())
