"""The base of every config section, and the error every bad config raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError", "Section"]


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names the offending dotted key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def changed(self) -> list[str]:
        """Names of the fields whose value differs from the default (a dumped config sets them all)."""
        return [name for name, info in type(self).model_fields.items() if getattr(self, name) != info.default]
