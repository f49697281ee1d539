"""Tuning specs (schema, read, write) and the records database."""
from .records import Record, Records, RecordsError
from .spec import SCHEMA_VERSION, SpecError, dumps, load_spec, schema, spec_filename, validate, write_spec

__all__ = ["Record", "Records", "RecordsError", "SCHEMA_VERSION", "SpecError", "dumps", "load_spec", "schema",
           "spec_filename", "validate", "write_spec"]
