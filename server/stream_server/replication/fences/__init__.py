"""The fences the app asks before answering: whether this replica may answer reads up to
date, and whether it may take a write now (docs/replication.md, "Reads").
"""
