"""Errors a user can act on: each names the field and the value at fault."""


class ConfigError(ValueError):
    """A configuration value is out of range or malformed."""

    def __init__(self, field: str, value: object, reason: str):
        self.field, self.value, self.reason = field, value, reason
        super().__init__(f"{field}={value!r}: {reason}")


def require(condition: bool, field: str, value: object, reason: str) -> None:
    """Raise ConfigError(field, value, reason) unless `condition` holds."""
    if not condition:
        raise ConfigError(field, value, reason)
