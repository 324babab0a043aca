"""A user's own estimator or loss, named in the YAML: ``{type: custom, path: my_algo.py:MyLoss, ...kwargs}``.

The class at ``path`` (a file, or an importable module) subclasses `sao.algos.PolicyLoss` /
`sao.algos.AdvantageEstimator`; the other keys are its fields, validated when the config loads (a missing or
unknown field, or a bad value, is refused naming the key). `build` gives the user's object; the config keeps
``type``/``path``/kwargs, so a dumped config loads back the same, and the object pickles as its config (a Ray
trainer rank re-imports the file).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from sao.user_code import UserCodeError, load_symbol

from .base import AdvantageEstimator, AlgoPart, PolicyLoss

__all__ = ["CustomEstimator", "CustomFieldsError", "CustomLoss"]


class CustomFieldsError(ValueError):
    """The user's class refused its fields: ``problems`` lists ``(field, message)``; ``origin`` names the
    class and its source (the config loader reports each as ``algo.<section>.<field>``)."""

    def __init__(self, origin: str, problems: list[tuple[str, str]]) -> None:
        self.origin, self.problems = origin, problems
        super().__init__(f"{origin}: " + "; ".join(f"{field}: {msg}" for field, msg in problems))


def _instantiate(path: str, base: type[AlgoPart], kwargs: dict[str, Any]) -> Any:
    try:
        cls = load_symbol(path)
    except UserCodeError as err:
        raise ValueError(f"path: {err}") from None
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise ValueError(f"path: {path} is not a subclass of sao.algos.{base.__name__}")
    try:
        return cls.model_validate(kwargs)
    except ValidationError as err:
        problems = [(".".join(str(p) for p in e["loc"]) or cls.__name__, e["msg"]) for e in err.errors()]
        raise CustomFieldsError(f"{cls.__name__} from {path}", problems) from None


class _Custom(AlgoPart):
    model_config = ConfigDict(extra="allow", validate_assignment=True)

    type: Literal["custom"] = "custom"
    path: str = Field(
        ...,
        description="The class: 'path/to/file.py:ClassName' or 'package.module:ClassName'; the other "
        "keys of this section are its fields.",
    )
    _impl: Any = PrivateAttr(None)
    _base: ClassVar[type[AlgoPart]] = AlgoPart

    @model_validator(mode="after")
    def _load(self) -> _Custom:
        self._impl = _instantiate(self.path, self._base, dict(self.model_extra or {}))
        return self

    def build(self) -> Any:
        """The user's object, with the kwargs validated."""
        return self._impl

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self).model_validate, (self.model_dump(),))


class CustomEstimator(_Custom):
    """``algo.advantage: {type: custom, path: ..., ...}``: a subclass of `AdvantageEstimator`."""

    _base: ClassVar[type[AlgoPart]] = AdvantageEstimator

    @property
    def uses_critic(self) -> bool:
        return bool(self._impl.uses_critic)


class CustomLoss(_Custom):
    """``algo.loss: {type: custom, path: ..., ...}``: a subclass of `PolicyLoss`."""

    _base: ClassVar[type[AlgoPart]] = PolicyLoss
