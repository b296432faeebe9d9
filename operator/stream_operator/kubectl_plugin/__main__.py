"""``python -m stream_operator.kubectl_plugin``: the same as the ``kubectl-dstream`` script."""

from stream_operator.kubectl_plugin.cli import main

raise SystemExit(main())
