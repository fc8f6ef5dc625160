"""Route handlers: native llama-server routes (native.py) and OpenAI routes (openai.py)."""
