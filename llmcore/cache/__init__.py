"""KV block pool and per-sequence cache state (see pool.py and state.py)."""
from .pool import BlockPool, KVCacheFullError, kv_row_shape
from .state import CacheState, KVCacheState, KVSnapshot, SeqSnapshot, SeqState

__all__ = ["BlockPool", "KVCacheFullError", "kv_row_shape", "CacheState", "KVCacheState",
           "KVSnapshot", "SeqSnapshot", "SeqState"]
