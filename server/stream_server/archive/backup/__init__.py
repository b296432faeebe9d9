"""Base backups and restore: taking a backup, the catalog and its retention, which lsns
the archive covers, and restore with point-in-time recovery (docs/backup.md).
"""
