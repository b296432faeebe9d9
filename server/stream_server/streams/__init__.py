"""Stream semantics: the protocol's rules over the storage engine, with no HTTP in sight."""
