"""Iris Desktop: offline, private chat with a local LLM and an honest context engine."""

__version__ = "0.1.0"
