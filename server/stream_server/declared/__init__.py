"""The settings' declaration, imported by the layers that read them: what a setting
is (``about.py``), what its value may be (``checks.py``) and each concern's group
of settings (``groups.py``), which the part that reads it receives as it is.

It imports nothing of ours but the format (an import contract says so), so that
every layer may import its group; the checks that need a layer's parser, and the
server's whole ``Settings``, are ``config``'s, above the layers.
"""
