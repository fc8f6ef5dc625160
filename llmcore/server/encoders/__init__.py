"""One encoder per API: engine events in, that API's JSON body or SSE events out.

base.py (the interface), chat_output.py (generated text -> reasoning / content / tool-call
deltas, for the chat APIs), logprobs.py, openai_common.py, openai_chat.py, openai_text.py,
native.py, anthropic.py, responses.py."""
