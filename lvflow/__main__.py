"""`python -m lvflow …`: the `lvflow` command (where its script is not on the PATH)."""

from ._workflow.cli import main

raise SystemExit(main())
