"""What a DurableStream becomes: the Kubernetes objects the operator would apply, as
plain dicts (CloudNativePG's ``pkg/specs``).

Pure functions of the parsed spec (``api``): the StatefulSet, Services, ConfigMap and
the rest side by side in ``render``, with the parts it draws on (``archive_render``,
``certificates``, ``disruptions``, ``monitoring``, ``network_policy``, ``webhook_ca``),
the built-in CA's certificates (``builtin_ca``) and the Spark applications
(``analytics``, ``spark_manifests``). No API call, so every object is unit-tested
without a cluster; the controllers apply what these return.
"""
