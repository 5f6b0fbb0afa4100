"""User-facing errors: each carries a one-line, actionable message naming the file or field."""


class TrtspecError(ValueError):
    """Base of every error the CLI reports as a one-line message instead of a traceback."""


class ConfigError(TrtspecError):
    """A build config is missing, malformed, or has a field of the wrong kind."""


class CheckpointError(TrtspecError):
    """A checkpoint directory cannot be loaded or does not fit its partner model."""
