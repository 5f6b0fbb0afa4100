"""The base of trtspec's YAML configs (the build config and its `deployment:` section): unknown keys
refused, and a boolean refused where a number belongs. pydantic's lax mode reads YAML's `true` as
1 for an int field, so `limits.max_tokens: true` built a deployment that generated one token.
Also how an error quotes a refused value and a file's first mistake (the build config, sts.json, the
SPS table)."""

from __future__ import annotations

import reprlib
from typing import Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

MAX_SHOWN = 200  # characters of a value or message an error quotes
_SHORT_REPR = reprlib.Repr()  # (keyword arguments only from Python 3.12)
_SHORT_REPR.maxlevel, _SHORT_REPR.maxlist, _SHORT_REPR.maxdict, _SHORT_REPR.maxtuple = 3, 8, 8, 8
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = _SHORT_REPR.maxlong = MAX_SHOWN


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


def shown(value: object) -> str:
    """A value as an error quotes it: its repr, cut to MAX_SHOWN characters (400 bytes of YAML
    aliases expand to megabytes: the error was 53 MB); an integer too long for a repr by its size."""
    try:
        text = _SHORT_REPR.repr(value)  # a few items of a few levels: never the whole expansion
    except ValueError:  # an int past Python's 4,300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103):,} digits"
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


def message(error: dict) -> str:
    """A pydantic error's message without the "Value error, " it puts before a validator's own."""
    return error["msg"].removeprefix("Value error, ")


def first_mistake(exc: ValidationError) -> str:
    """A file's first mistake on one line, `field.0: what was expected, got X` (no field where the
    whole file is wrong; no value where a field is missing: the value would be the file)."""
    error = exc.errors()[0]
    field = ".".join(str(part)[:MAX_SHOWN] for part in error["loc"])
    got = "" if error["type"] == "missing" else f", got {shown(error.get('input'))}"
    return (f"{field}: " if field else "") + message(error) + got
