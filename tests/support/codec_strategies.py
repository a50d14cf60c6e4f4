"""Hypothesis strategies for the generated codecs, derived from the parsed schemas.

Test-only helper (needs ``hypothesis``, part of the ``test`` extra). The
strategies walk the generator's model of a schema, so every message, field,
group and var-data member is covered without listing them by hand::

    from support import codec_strategies as testing
    for schema in testing.schemas():
        for message in schema.messages:
            fields = testing.message_fields(message).example()   # kwargs for <Message>Encoder.encode
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from fulmar.codecs.generate import FieldDef, GroupDef, MessageDef, SchemaDef, VarDataDef, load_all

MAX_TEXT = 40
MAX_BYTES = 40
MAX_ENTRIES = 3


@lru_cache(maxsize=1)
def _schemas() -> tuple[SchemaDef, ...]:
    return tuple(load_all())


def schemas() -> tuple[SchemaDef, ...]:
    """The generator's model of every schema (parsed once per process)."""
    return _schemas()


def field_values(f: FieldDef) -> st.SearchStrategy[Any]:
    """Any value the field's wire type can hold; enums favour listed values but include unknown ones."""
    if f.is_array:
        return st.binary(min_size=f.size, max_size=f.size)
    full_range = st.integers(min_value=f.primitive.lo, max_value=f.primitive.hi)
    if f.enum is not None:
        listed = [value for _, value in f.enum.values] + [f.enum.null]
        return st.one_of(st.sampled_from(listed), full_range)
    return full_range


def var_data_values(v: VarDataDef) -> st.SearchStrategy[Any]:
    if v.ascii:
        return st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=MAX_TEXT)
    return st.binary(max_size=MAX_BYTES)


def _members(owner: MessageDef | GroupDef) -> st.SearchStrategy[dict[str, Any]]:
    members: dict[str, st.SearchStrategy[Any]] = {}
    for f in owner.fields:
        members[f.py] = field_values(f)
    for g in owner.groups:
        members[g.py] = st.lists(_members(g), max_size=MAX_ENTRIES)
    for v in owner.var_data:
        members[v.py] = var_data_values(v)
    return st.fixed_dictionaries(members)


def message_fields(message: MessageDef) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments for the message's ``encode`` covering every member."""
    return _members(message)


def encoded_length_bound(message: MessageDef) -> int:
    """A buffer size that always holds an encoding drawn from ``message_fields`` (header included)."""

    def bound(owner: MessageDef | GroupDef) -> int:
        size = owner.block_length
        size += sum(4 + MAX_ENTRIES * bound(g) for g in owner.groups)
        size += sum(v.length_primitive.size + max(MAX_TEXT, MAX_BYTES) + v.align for v in owner.var_data)
        return size

    return 8 + bound(message)
