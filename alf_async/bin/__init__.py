"""Command-line entry points (alf-async-train)."""
