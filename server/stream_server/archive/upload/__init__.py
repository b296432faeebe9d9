"""The continuous WAL archive: where the archive ends along the term history, the frames
the local WAL still holds, their grouping into objects, the uploading thread, and the ack
gate of ``--archive-mode required`` (docs/archive.md).
"""
