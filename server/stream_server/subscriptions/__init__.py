"""Subscriptions: durable cursors over sets of streams that wake workers by webhook or pull-wake."""
