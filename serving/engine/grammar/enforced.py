"""What the grammar compiler (xgrammar) enforces of a JSON schema: the one table that the API's
check (serving.api.core.schema_rules, which refuses the rest with a 400) and the compiler's
own preparation of a schema (formats) both read.
"""

from __future__ import annotations

# What xgrammar 0.2.9 enforces, found by compiling a small schema per keyword as the engine
# does (serving.engine.grammar.compiler) and checking, with jsonschema, the outputs of random
# walks through its grammar (strict mode on and off):
#   enforced      type properties required additionalProperties patternProperties
#                 propertyNames minProperties maxProperties items prefixItems unevaluatedItems
#                 minItems maxItems enum const anyOf $ref $defs definitions minimum maximum
#                 exclusiveMinimum exclusiveMaximum minLength maxLength pattern
#                 format (FORMATS); multipleOf on integers, up to 1024; allOf of one schema
#   not enforced  uniqueItems contains minContains maxContains not if/then/else
#                 dependentRequired dependentSchemas unevaluatedProperties (without strict)
#                 oneOf (overlapping branches become anyOf) allOf of several, $anchor,
#                 multipleOf on numbers, nullable and unknown keywords: ignored
#   patterns      lookarounds and anchors inside are dropped (serving.api.core.schema_patterns
#                 refuses such patterns); an optional group with a repeat inside loses its first character unless
#                 spelt {0,1}, which the engine does (serving.engine.grammar.formats)
#   broken JSON   a pattern naming ", \ or a control character emits them unescaped
#                 (minLength/maxLength did too until the engine took control characters
#                 out of the grammar's negated classes)
#   conditional   string keywords need `type` string, bounds need integer or number (ignored
#                 otherwise); enum/const, anyOf, allOf and $ref drop sibling assertions; a
#                 `required` name that properties lacks is ignored; pattern and format drop
#                 minLength/maxLength beside them
#   numbers       written with at most 6 decimals and no exponent: a range holding no such
#                 number compiles to an empty grammar (an empty answer); integer bounds must
#                 be whole (a compile error otherwise)
#   formats       date and date-time allow days a month lacks (02-31), so the engine compiles
#                 them as exact patterns (serving.engine.grammar.formats); ipv4 allows 01.2.3.4;
#                 iri, idn-email, idn-hostname, regex ignored; the others not verified
# Annotations (ANNOTATIONS) are always accepted: they assert nothing.
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$schema", "$id",
                         "$comment", "deprecated", "readOnly", "writeOnly"})  # fmt: skip
KEYWORDS = frozenset({
    "type", "properties", "required", "additionalProperties", "patternProperties",
    "propertyNames", "minProperties", "maxProperties", "items", "prefixItems",
    "unevaluatedItems", "minItems", "maxItems", "enum", "const", "anyOf", "allOf", "$ref",
    "$defs", "definitions", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minLength", "maxLength", "pattern", "format",
})  # fmt: skip
# compiled as exact patterns instead (formats.PATTERNS): xgrammar's own rules allow 02-31
EXACT_FORMATS = ("date", "date-time")
FORMATS = frozenset({"time", "duration", "email", "hostname", "ipv6", "uri", "uri-reference",
                     "uuid", "json-pointer", *EXACT_FORMATS})  # fmt: skip
WHY = {  # refused keywords whose reason says more than "not enforced"
    "oneOf": "the grammar compiler treats overlapping branches as anyOf; use anyOf",
    "nullable": 'not JSON Schema; use "type": [..., "null"]',
    "unevaluatedProperties": 'not enforced without strict; use "additionalProperties": false',
}
STRING_ONLY = frozenset({"minLength", "maxLength", "pattern", "format"})
NUMBER_ONLY = frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
ALONE = ("$ref", "anyOf", "allOf")  # each beside annotations and definitions only
VALUES = ("const", "enum")  # each beside annotations, definitions and type only
LENGTHS = ("minLength", "maxLength")
MAX_MULTIPLE_OF = 1024  # xgrammar drops a larger one (and writes any integer)
DECIMALS = 6  # the most fraction digits xgrammar writes for a bounded number
