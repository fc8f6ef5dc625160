"""The engine: one thread owns the model and the slots; requests queue for a free slot."""
from .core import (Completion, Engine, EngineConfig, EngineStatus, ErrorEvent, FinalEvent,
                   GenParams, Task, Timings, TokenEvent, common_prefix, load_engine)

__all__ = [
    "Engine", "EngineConfig", "EngineStatus", "GenParams", "Task", "TokenEvent", "FinalEvent",
    "ErrorEvent", "Timings", "Completion", "common_prefix", "load_engine",
]
