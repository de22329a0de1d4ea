"""JSON Schemas the tests ask for: the shapes an evaluation rubric takes."""

from __future__ import annotations

from typing import Any

VERDICT: dict[str, Any] = {
    "title": "Verdict",
    "type": "object",
    "properties": {
        "score": {"type": "integer", "minimum": 1, "maximum": 5},
        "label": {"type": "string", "enum": ["relevant", "partly", "irrelevant"]},
        "confident": {"type": "boolean"},
        "summary": {"type": "string", "minLength": 10, "maxLength": 200},
        "probability": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "evidence": {
            "type": "array",
            "minItems": 1,
            "maxItems": 4,
            "items": {
                "type": "object",
                "properties": {
                    "quote": {"type": "string"},
                    "page": {"type": ["integer", "null"], "minimum": 1},
                },
                "required": ["quote", "page"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["score", "label", "confident", "summary", "probability", "evidence"],
    "additionalProperties": False,
}

SCHEMAS: list[dict[str, Any]] = [
    VERDICT,
    {
        "type": "object",
        "$defs": {
            "claim": {
                "type": "object",
                "properties": {
                    "text": {"type": "string"},
                    "supported": {"type": "boolean"},
                    "checked_at": {"type": "string", "format": "date-time"},
                },
                "required": ["text", "supported"],
            }
        },
        "properties": {
            "claims": {"type": "array", "items": {"$ref": "#/$defs/claim"}, "uniqueItems": True},
            "id": {"type": "string", "format": "uuid"},
            "weight": {"type": "number", "multipleOf": 5, "minimum": 10, "maximum": 50},
            "kind": {"const": "review"},
            "either": {"anyOf": [{"type": "integer", "minimum": 100}, {"type": "null"}]},
        },
        "required": ["claims", "id", "weight", "kind", "either"],
    },
    {"type": "array", "items": {"type": "string", "enum": ["x", "y", "z"]}, "minItems": 2},
    {
        "allOf": [
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            {"properties": {"b": {"type": "string", "format": "email"}}, "required": ["b"]},
        ]
    },
    {"type": "integer", "exclusiveMinimum": 3, "exclusiveMaximum": 9},
    {"type": "string", "format": "date"},
]
