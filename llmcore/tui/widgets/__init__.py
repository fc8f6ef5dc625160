"""Dashboard widgets, one per module."""
from .cache_gauges import CacheGauges
from .event_log import EventLog
from .help_screen import HelpScreen
from .requests_pane import RequestsPane
from .slot_table import SlotTable
from .status_bar import StatusBar
from .throughput import Throughput

__all__ = ["CacheGauges", "EventLog", "HelpScreen", "RequestsPane", "SlotTable", "StatusBar", "Throughput"]
