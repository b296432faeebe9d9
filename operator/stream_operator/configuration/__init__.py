"""The operator's own settings (``DS_OPERATOR_*``), read and checked once at start
(CloudNativePG's ``internal/configuration``): below everything, since the API types'
defaults, the renderers and the API client all read them.
"""
