"""Textual dashboard for llmcore (`llmcore tui`).

`snapshot` (plain data, formatting, events) and `source` (in-process, HTTP, fake) need no
Textual; `app.Dashboard` is the App; `run` holds the command-line modes.
"""
