"""Stores: the engine's only I/O. One transaction per engine call (see base.Store)."""
