"""Textual dashboard for llmcore (`llmcore tui`).

Plain data, no Textual: `snapshot` (one poll as a `Snapshot`), `parsing` (EngineStats or
HTTP routes -> Snapshot), `formatting` (numbers -> text with units, phrases into lines, the
gauges, hit rates and slot columns), `history` (rates over a window and events over time),
`source` (in-process, HTTP, fake). With Textual: `app.Dashboard` (the App, its keys and
layout breakpoints), `widgets/` (one per module; `panel.Panel` draws lines built for its
width), `messages`, `dashboard.tcss`; `run` holds the command-line modes.
"""
