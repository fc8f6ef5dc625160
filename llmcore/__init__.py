"""llmcore: CPU inference engine and server for GGUF language models."""

__version__ = "0.1.0"
