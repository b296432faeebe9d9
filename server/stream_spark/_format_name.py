"""The name Spark knows the data source by: ``spark.read.format(FORMAT_NAME)``.

Its own module so that the package (which registers the source) and the source
(which names itself) both import it, and neither imports the other at start.
"""

from __future__ import annotations

FORMAT_NAME = "durable-streams"
