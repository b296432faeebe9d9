"""``python -m stream_operator.plugin``: the same as the ``kubectl-dstream`` script."""

from stream_operator.plugin.cli import main

raise SystemExit(main())
