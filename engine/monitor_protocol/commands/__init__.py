"""Subcommands of `mp`."""
