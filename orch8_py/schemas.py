"""JSON Schema in the language: a definition's ``input_schema`` (the instance's data,
checked when it starts) and a step's ``output_schema`` (its handler's output). Checked
with the jsonschema library (the dialect a schema names with ``$schema``, else
2020-12), never by hand. PostgreSQL has no JSON Schema validator, so these checks live in
Python: the doors that start instances (sqlapi.instances.create_instance, a runner
starting a sub_sequence's child) and the runner (outputs)."""

from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema import exceptions as schema_errors


def _validator(schema: dict[str, Any]) -> Any:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not a JSON Schema, or None."""
    if not isinstance(schema, dict):
        return "a JSON Schema is an object"
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except schema_errors.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        return f"not a valid JSON Schema{f' at {where}' if where else ''}: {exc.message}"
    return None


def first_violation(schema: dict[str, Any], value: Any) -> tuple[str, str] | None:
    """(JSON pointer, message) of the first place ``value`` breaks ``schema``, or None."""
    errors = sorted(_validator(schema).iter_errors(value), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    error = errors[0]
    pointer = "".join(
        "/" + str(p).replace("~", "~0").replace("/", "~1") for p in error.absolute_path
    )
    return pointer or "/", error.message


def input_problem(definition: dict[str, Any], data: Any) -> str | None:
    """Why an instance's data does not match the definition's input_schema, or None."""
    schema = definition.get("input_schema")
    if not isinstance(schema, dict):
        return None
    found = first_violation(schema, data)
    return None if found is None else f"data does not match input_schema at {found[0]}: {found[1]}"


def output_problem(schema: dict[str, Any], output: Any) -> str | None:
    """Why a handler's output does not match the step's output_schema, or None."""
    found = first_violation(schema, output)
    if found is None:
        return None
    return f"the output does not match output_schema at {found[0]}: {found[1]}"
