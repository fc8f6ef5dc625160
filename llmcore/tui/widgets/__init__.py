"""Dashboard widgets, one per module (`panel.Panel` is the base of the text panes)."""
from .cache_gauges import CacheGauges
from .event_log import EventLog
from .help_screen import HelpScreen
from .key_bar import KeyBar
from .requests_pane import RequestsPane
from .slot_table import SlotTable
from .status_bar import StatusBar
from .throughput import Throughput

__all__ = ["CacheGauges", "EventLog", "HelpScreen", "KeyBar", "RequestsPane", "SlotTable", "StatusBar",
           "Throughput"]
