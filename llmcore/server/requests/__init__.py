"""Reading request bodies: the JSON body (body.py), typed fields and generation settings
(fields.py), the chat request every chat-style API becomes (chat.py), and the Anthropic
and Responses requests translated into it (anthropic.py, responses.py)."""
