"""Environments the driver runs: every one reaches it as a tf-agents TFEnvironment."""
