"""Spark analytics tests (a package, so that its conftest does not shadow the root one)."""
