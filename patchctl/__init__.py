"""patchctl: versioned downstream patches for LLM inference engines."""

__version__ = "0.1.0"
