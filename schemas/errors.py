"""The small error family every user-facing failure in hbpe raises.

The CLI catches `HbpeError` and prints its message without a traceback, so each
message names the problem, the offending value or file, and the fix.
"""


class HbpeError(Exception):
    """Base class: a user-facing error whose message says what to do."""


class ArtifactError(HbpeError, ValueError):
    """A tokenizer artifact, manifest or shard directory is missing, edited or inconsistent."""


class EncodingUnavailableError(HbpeError, RuntimeError):
    """A first-stage encoding cannot be loaded (no network, unknown name, bad file)."""


class ConfigError(HbpeError, ValueError):
    """A configuration value is out of range or inconsistent with another."""
