"""Reading request bodies: the schema language every route's body is checked with
(schema.py), the JSON body read with its limits (body.py: `accepts(SCHEMA)`), typed fields
and generation settings (fields.py), the chat request every chat-style API becomes
(chat.py), the Anthropic and Responses requests translated into it (anthropic.py,
responses.py), the text, token and infill requests (text.py), what a request constrains
its output to (constraints.py), and embedding requests (embeddings.py)."""
