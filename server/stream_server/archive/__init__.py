"""The object-store archive: the WAL archived continuously, base backups, their catalog
and retention, and restore (docs/backup.md)."""
