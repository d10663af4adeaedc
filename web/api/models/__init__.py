"""The declarations of the REST API: one pydantic model per request body, query string,
path and answer. Validation (spectree) and the OpenAPI document (web/api/spec.py) are
both made from them, so they cannot disagree. One module per resource; ``base`` holds
the kinds of model and their settings."""
