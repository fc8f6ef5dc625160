"""Route handlers, thin: read the request, build the prompt, submit, hand the task to the
stream driver with the API's encoder. openai.py, anthropic.py, responses.py, native.py."""
