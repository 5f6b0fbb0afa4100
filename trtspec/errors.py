"""User-facing errors: each carries a one-line, actionable message naming the file or field."""

# how the served model's error for a step that failed begins (the model's fault, not the request's:
# Triton's INTERNAL, the OpenAI API's 500; a gRPC stream's error carries no code, only the message)
GENERATION_FAILED = "generation failed: "
# how its refusals begin when the server cannot take or finish a request now (Triton's UNAVAILABLE,
# the OpenAI API's 503: retry later or elsewhere): its queue is full (limits.max_queued), or it stops
SERVER_BUSY = "the server is busy: "
SHUTTING_DOWN = "the server is shutting down: "


class TrtspecError(ValueError):
    """Base of every error the CLI reports as a one-line message instead of a traceback."""


class ConfigError(TrtspecError):
    """A build config is missing, malformed, or has a field of the wrong kind."""


class CheckpointError(TrtspecError):
    """A checkpoint directory cannot be loaded or does not fit its partner model."""


class OptionError(TrtspecError):
    """A command-line option whose value does not fit what it names (a layer the target lacks);
    the CLI reports it as a usage error naming the option (exit 2), as it does a value out of range."""

    def __init__(self, option: str, why: str):
        super().__init__(f"{option} {why}")
        self.option, self.why = option, why
