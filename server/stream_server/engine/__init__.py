"""The storage engine: segment logs, shared WAL, LMDB metadata, group commit, recovery.

Nothing here knows about HTTP or the protocol's rules; see docs/storage-format.md.
"""

from stream_format.meta import StreamMeta
from stream_server.engine.batch import BatchStats, Tail
from stream_server.engine.data_dir import LayoutError
from stream_server.engine.engine import Engine
from stream_server.engine.pipeline import CommitPipeline
from stream_server.engine.recovery import LoadedState, RecoveryProgress, RecoveryReport
from stream_server.engine.storage_errors import (
    DamagedStream,
    HeadDropped,
    StorageError,
    StorageFailed,
)

__all__ = [
    "BatchStats",
    "CommitPipeline",
    "DamagedStream",
    "Engine",
    "HeadDropped",
    "LayoutError",
    "LoadedState",
    "RecoveryProgress",
    "RecoveryReport",
    "StorageError",
    "StorageFailed",
    "StreamMeta",
    "Tail",
]
