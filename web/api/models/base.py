"""The kinds of model, each with its settings:

- ``Body``: a JSON request body. Unknown fields are refused, JSON types are strict (no
  ``"5"`` for a number, no ``true`` for an integer); an optional field may be ``null``,
  meaning "not given".
- ``Query``: a query string. Unknown parameters are refused; values are read from text.
- ``Path``: the variables of a route's path.
- ``Answer``: a success answer, built from the door's rows: exactly these fields (a row's
  other columns are not answered by accident), every one present.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Path(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Answer(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        from_attributes=True,  # the door's dataclasses as well as its dict rows
        json_schema_serialization_defaults_required=True,
    )


class NoQuery(Query):
    """No query parameters (any is refused)."""


class NoBody(Body):
    """No body, or an empty JSON object."""
