"""Textual dashboard for llmcore (`llmcore tui`).

Plain data, no Textual: `snapshot` (one poll as a `Snapshot`), `parsing` (EngineStats or
HTTP routes -> Snapshot), `formatting` (numbers -> text), `history` (rates and events over
time), `source` (in-process, HTTP, fake). With Textual: `app.Dashboard` (the App),
`widgets/` (one per module), `messages`; `run` holds the command-line modes.
"""
