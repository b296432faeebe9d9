"""The DurableStream as the operator reads it: the spec parsed once into typed views
(``spec``, with its parts ``archive_spec``, ``pod_template``, ``server_settings``), the
checks a spec or a name must pass before anything is rendered (``names``, ``cron``,
``quantities``), and the status's condition type.

The bottom of the operator (CloudNativePG's ``api/``): it imports none of the other
folders but the operator's own settings, so every renderer, decision, controller and
the kubectl plugin may read it.
"""
