"""Keeping conversations inside the context window."""
