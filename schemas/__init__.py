"""Contracts shared by the pipeline and the trainer: light imports only (stdlib + numpy)."""
