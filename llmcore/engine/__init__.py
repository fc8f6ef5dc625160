"""The engine: one thread owns the model and the slots; requests queue for a free slot.

Its parts, one module each:

- ``config``     EngineConfig (how an engine is set up), GenParams (what a request asks)
- ``events``     TokenEvent / FinalEvent / ErrorEvent, Timings, StopReason, CacheSource
- ``task``       Task: a request as both sides see it, the bridge to asyncio or a thread
- ``protocols``  what the engine needs from a model, its sequence state, a tokenizer
- ``slot``       Slot (a state kept between requests) and Generation (the request on it)
- ``output``     stream decoding, stop strings and the hold-back
- ``prefix``     the prefix policy: which state serves a request (slot, RAM, checkpoint)
- ``memory``     the memory plan, admission, KV pressure
- ``scheduler``  from the slots to one step plan (decode tokens + prefill chunks)
- ``stats``      the engine's counters
- ``core``       Engine: the thread, the inbox, the loop that runs the steps
- ``client``     EngineClient: what a front end needs from an engine (Engine, ReplicaPool)
"""
from .client import EngineClient
from .config import EngineConfig, GenParams
from .core import Engine, EngineStatus, load_engine
from .events import CacheSource, Completion, ErrorEvent, FinalEvent, StopReason, Timings, TokenEvent
from .prefix import common_prefix
from .task import Task

__all__ = [
    "Engine", "EngineClient", "EngineConfig", "EngineStatus", "GenParams", "Task", "TokenEvent", "FinalEvent",
    "ErrorEvent", "Timings", "Completion", "StopReason", "CacheSource", "common_prefix",
    "load_engine",
]
