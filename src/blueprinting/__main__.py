"""``python -m blueprinting``: the same entry point as the ``blueprinting`` script."""

from blueprinting.cli.main import main

raise SystemExit(main())
