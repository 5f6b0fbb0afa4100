"""The base of trtspec's YAML configs (the build config and its `deployment:` section): unknown keys
refused, and a boolean refused where a number belongs. pydantic's lax mode reads YAML's `true` as
1 for an int field, so `limits.max_tokens: true` built a deployment that generated one token."""

from __future__ import annotations

from typing import Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def takes_numbers_only(annotation) -> bool:
    """Whether a field of type `annotation` takes ints or floats but no bool (a union's members
    looked at one by one, a Literal's values left aside)."""
    members = get_args(annotation) if get_origin(annotation) is not Literal else ()
    kinds = [kind for member in (members or (annotation,)) for kind in
             ((member,) if get_origin(member) is Literal or not get_args(member) else get_args(member))]
    return bool not in kinds and any(kind in (int, float) for kind in kinds)


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_numbers(cls, value, info: ValidationInfo):
        if isinstance(value, bool) and takes_numbers_only(cls.model_fields[info.field_name].annotation):
            raise ValueError("expected a number, not a boolean")
        return value
