"""Generate fulmar's Python codecs from the SBE schemas.

    python -m fulmar.codecs.generate            # (re)write codecs/generated/
    python -m fulmar.codecs.generate --out DIR  # write somewhere else
    python -m fulmar.codecs.generate --check    # exit 1 if codecs/generated/ is stale

Each schema in ``codecs/schemas/`` becomes one module in ``codecs/generated/``.

The schemas are read with the ``sbe`` package's parser (sbe 0.4.3). Two quirks
of that parser are handled here, so the schema files stay plain SBE:

- it wants the XML as bytes, so the file is parsed with lxml and re-serialised;
- it cannot resolve an enum ``encodingType`` that names a primitive other than
  uint8/uint16/char (Aeron's enums are int32) unless a ``<type>`` of that name
  exists, so such types are added to ``<types>`` before parsing.

The parser keeps the structure (types, enums, messages, fields, groups, var
data) but drops some attributes: ``sinceVersion``, field ``presence`` and
``offset``, array ``length`` of non-char types, ``maxValue`` and
``characterEncoding`` of var-data composites, message ``deprecated``, and
fulmar's extensions. The generator reads those from the same XML elements,
walking them in step with the parsed fields (names are checked to match).

fulmar extensions (namespace ``urn:fulmar:sbe-extensions``, ignored by other SBE
tools):

- ``fulmar:headerless="true"`` on ``messageSchema``: the messages are never
  framed by a message header (the driver command protocol); the message id is
  the ring-buffer msg_type_id and only headerless codecs are generated.
- ``fulmar:align="N"`` on ``<data>``: the var-data payload is followed by zero
  padding to a multiple of N bytes (Aeron's counter key and image log file name).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import io
import keyword
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sbe

# lxml ships no type stubs; the generator treats its elements as Any.
ET: Any = importlib.import_module("lxml.etree")

HERE = Path(__file__).resolve().parent
SCHEMA_DIR = HERE / "schemas"
GENERATED_DIR = HERE / "generated"

SBE_NS = "http://fixprotocol.io/2016/sbe"
FULMAR_NS = "urn:fulmar:sbe-extensions"

# (module name, schema file) for every generated module.
SCHEMAS: tuple[tuple[str, str], ...] = (
    ("cluster", "cluster-codecs.xml"),
    ("archive", "archive-codecs.xml"),
    ("driver", "driver-codecs.xml"),
    ("archive_mark", "archive-mark-codecs.xml"),
    ("cluster_mark", "cluster-mark-codecs.xml"),
)

# Enum encoding types sbe 0.4.3 resolves by itself.
_SBE_NATIVE_ENUM_ENCODINGS = {"uint8", "uint16", "char"}

# Names the generated classes use for themselves.
_RESERVED_NAMES = {
    "wrap",
    "wrap_headerless",
    "wrap_and_apply_header",
    "to_dict",
    "encode",
    "encode_headerless",
    "encode_fields",
}


class GeneratorError(Exception):
    """The schema uses something this generator does not support, or is inconsistent."""


# --------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Primitive:
    name: str
    fmt: str  # struct format character
    size: int
    null: int  # SBE null value
    lo: int  # smallest storable value
    hi: int  # largest storable value
    codec: str  # runtime Struct for a single value


PRIMITIVES = {
    p.name: p
    for p in (
        Primitive("char", "s", 1, 0, 0, 255, ""),
        Primitive("int8", "b", 1, -(2**7), -(2**7), 2**7 - 1, "_rt.I8"),
        Primitive("uint8", "B", 1, 2**8 - 1, 0, 2**8 - 1, "_rt.U8"),
        Primitive("int16", "h", 2, -(2**15), -(2**15), 2**15 - 1, "_rt.I16"),
        Primitive("uint16", "H", 2, 2**16 - 1, 0, 2**16 - 1, "_rt.U16"),
        Primitive("int32", "i", 4, -(2**31), -(2**31), 2**31 - 1, "_rt.I32"),
        Primitive("uint32", "I", 4, 2**32 - 1, 0, 2**32 - 1, "_rt.U32"),
        Primitive("int64", "q", 8, -(2**63), -(2**63), 2**63 - 1, "_rt.I64"),
        Primitive("uint64", "Q", 8, 2**64 - 1, 0, 2**64 - 1, "_rt.U64"),
    )
}


@dataclass
class EnumDef:
    name: str
    primitive: Primitive
    null: int
    values: list[tuple[str, int]]
    description: str


@dataclass
class FieldDef:
    """A fixed-size field of a root block or group entry."""

    name: str
    py: str
    id: int
    primitive: Primitive
    length: int  # > 1 (or a char type): a fixed array, read and written as bytes
    offset: int
    since_version: int
    optional: bool
    null: int | bytes
    enum: EnumDef | None
    description: str

    @property
    def is_array(self) -> bool:
        return self.length > 1 or self.primitive.name == "char"

    @property
    def fmt(self) -> str:
        return f"{self.length * self.primitive.size}s" if self.is_array else self.primitive.fmt

    @property
    def size(self) -> int:
        return self.length * self.primitive.size

    @property
    def slot(self) -> str:
        """Attribute holding the wire value in a decoder (enums keep the raw int here)."""
        return f"{self.py}_raw" if self.enum else self.py


@dataclass
class VarDataDef:
    name: str
    py: str
    id: int
    since_version: int
    ascii: bool
    length_primitive: Primitive
    max_length: int
    align: int  # 0: no padding after the payload
    description: str


@dataclass
class GroupDef:
    name: str
    py: str
    id: int
    since_version: int
    class_name: str
    block_length: int
    fields: list[FieldDef]
    groups: list[GroupDef]
    var_data: list[VarDataDef]
    description: str


@dataclass
class MessageDef:
    name: str
    class_name: str  # decoder / encoder class name stem
    const: str  # UPPER_SNAKE name used for module-level constants
    id: int
    since_version: int
    deprecated: int | None
    block_length: int
    fields: list[FieldDef]
    groups: list[GroupDef]
    var_data: list[VarDataDef]
    description: str


@dataclass
class SchemaDef:
    module: str
    filename: str
    id: int
    version: int
    semantic_version: str
    package: str
    description: str
    headerless: bool
    enums: list[EnumDef] = field(default_factory=list)
    messages: list[MessageDef] = field(default_factory=list)

    def message(self, name: str) -> MessageDef:
        return next(m for m in self.messages if m.name == name)


# --------------------------------------------------------------------------- loading


def snake(name: str) -> str:
    """leadershipTermId -> leadership_term_id."""
    out = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    return out + "_" if keyword.iskeyword(out) else out


def upper_first(name: str) -> str:
    return name[:1].upper() + name[1:]


def _local(tag: Any) -> str:
    return tag.rsplit("}", 1)[-1] if isinstance(tag, str) else ""


def _elements(el: Any) -> list[Any]:
    return [child for child in el if isinstance(child.tag, str)]


def parse_with_sbe(xml: bytes) -> tuple[sbe.Schema, Any]:
    """Parse schema XML with the sbe package; return its model and the lxml root."""
    root = ET.fromstring(xml)
    types_el = root.find("types")
    if types_el is None:
        raise GeneratorError("schema has no <types>")
    declared = {el.get("name") for el in _elements(types_el)}
    for el in _elements(types_el):
        encoding = el.get("encodingType")
        if _local(el.tag) in ("enum", "set") and encoding in PRIMITIVES:
            if encoding not in _SBE_NATIVE_ENUM_ENCODINGS and encoding not in declared:
                ET.SubElement(types_el, "type", name=encoding, primitiveType=encoding)
                declared.add(encoding)
    data = ET.tostring(root, xml_declaration=True, encoding="UTF-8")
    return sbe.Schema.parse(io.BytesIO(data)), ET.fromstring(xml)


def load_schema(module: str, filename: str, schema_dir: Path = SCHEMA_DIR) -> SchemaDef:
    """Read one schema file into the generator's model."""
    xml = (schema_dir / filename).read_bytes()
    parsed, root = parse_with_sbe(xml)
    return _Builder(module, filename, parsed, root).build()


def load_all(schema_dir: Path = SCHEMA_DIR) -> list[SchemaDef]:
    return [load_schema(module, filename, schema_dir) for module, filename in SCHEMAS]


class _Builder:
    def __init__(self, module: str, filename: str, parsed: sbe.Schema, root: Any) -> None:
        self.module = module
        self.filename = filename
        self.parsed = parsed
        self.root = root
        self.xml_types = {el.get("name"): el for el in _elements(root.find("types"))}
        self.enums: dict[str, EnumDef] = {}

    def build(self) -> SchemaDef:
        root = self.root
        schema = SchemaDef(
            module=self.module,
            filename=self.filename,
            id=int(root.get("id")),
            version=int(root.get("version", "0")),
            semantic_version=root.get("semanticVersion", ""),
            package=root.get("package", ""),
            description=root.get("description", ""),
            headerless=root.get(f"{{{FULMAR_NS}}}headerless", "false") == "true",
        )
        if root.get("byteOrder", "littleEndian") != "littleEndian":
            raise GeneratorError(f"{self.filename}: only littleEndian schemas are supported")
        if int(self.parsed.id) != schema.id or int(self.parsed.version) != schema.version:
            raise GeneratorError(f"{self.filename}: sbe parser disagrees on schema id/version")
        self._check_header()
        for name, el in self.xml_types.items():
            if _local(el.tag) == "enum":
                self.enums[name] = self._enum(self.parsed.types[name], el)
            elif _local(el.tag) == "set":
                raise GeneratorError(f"{self.filename}: <set> {name} is not supported")
        schema.enums = list(self.enums.values())
        seen: set[int] = set()
        for el in root.iter(f"{{{SBE_NS}}}message"):
            message = self._message(el)
            if message.id in seen:
                raise GeneratorError(f"{self.filename}: duplicate template id {message.id}")
            seen.add(message.id)
            schema.messages.append(message)
        if len(schema.messages) != len(self.parsed.messages):
            raise GeneratorError(f"{self.filename}: message count differs from the sbe parser's")
        return schema

    def _check_header(self) -> None:
        header = self.parsed.types.get(self.parsed.header_type_name)
        names = [(t.name, t.primitiveType.value) for t in getattr(header, "types", [])]
        expected = [("blockLength", "uint16"), ("templateId", "uint16"), ("schemaId", "uint16"), ("version", "uint16")]
        if names != expected:
            raise GeneratorError(f"{self.filename}: messageHeader must be {expected}, got {names}")

    def _enum(self, parsed: Any, el: Any) -> EnumDef:
        encoding = parsed.encodingType
        if isinstance(encoding, sbe.Type):
            primitive = PRIMITIVES[encoding.primitiveType.value]
            null = encoding.nullValue if isinstance(encoding.nullValue, int) else primitive.null
        else:
            primitive = PRIMITIVES[encoding.value]
            null = primitive.null
        if primitive.name == "char":
            raise GeneratorError(f"{self.filename}: char enum {parsed.name} is not supported")
        values = [(v.name, int(v.value)) for v in parsed.valid_values]
        return EnumDef(parsed.name, primitive, null, values, el.get("description", ""))

    def _message(self, el: Any) -> MessageDef:
        template_id = int(el.get("id"))
        parsed = self.parsed.messages[template_id]
        name = el.get("name")
        if parsed.name != name:
            raise GeneratorError(
                f"{self.filename}: message {template_id} named {parsed.name!r} by sbe, {name!r} in XML"
            )
        class_name = upper_first(name)
        fields, groups, var_data, block_length = self._members(name, class_name, parsed.fields, el)
        deprecated = el.get("deprecated")
        return MessageDef(
            name=name,
            class_name=class_name,
            const=snake(class_name).rstrip("_").upper(),
            id=template_id,
            since_version=int(el.get("sinceVersion", "0")),
            deprecated=int(deprecated) if deprecated is not None else None,
            block_length=block_length,
            fields=fields,
            groups=groups,
            var_data=var_data,
            description=el.get("description", ""),
        )

    def _members(
        self, owner: str, class_name: str, parsed_fields: list[Any], el: Any
    ) -> tuple[list[FieldDef], list[GroupDef], list[VarDataDef], int]:
        children = _elements(el)
        if len(children) != len(parsed_fields):
            raise GeneratorError(f"{self.filename}: {owner}: member count differs from the sbe parser's")
        fields: list[FieldDef] = []
        groups: list[GroupDef] = []
        var_data: list[VarDataDef] = []
        cursor = 0
        for parsed, child in zip(parsed_fields, children):
            tag = _local(child.tag)
            where = f"{self.filename}: {owner}.{child.get('name')}"
            if parsed.name != child.get("name"):
                raise GeneratorError(f"{where}: sbe parser has {parsed.name!r} here")
            if snake(parsed.name) in _RESERVED_NAMES:
                raise GeneratorError(f"{where}: name clashes with a generated method")
            if tag == "field":
                if groups or var_data:
                    raise GeneratorError(f"{where}: fields must precede groups and var data")
                f = self._field(where, parsed, child, cursor)
                fields.append(f)
                cursor = f.offset + f.size
            elif tag == "group":
                if var_data:
                    raise GeneratorError(f"{where}: groups must precede var data")
                groups.append(self._group(where, class_name, parsed, child))
            elif tag == "data":
                var_data.append(self._var_data(where, parsed, child))
            else:
                raise GeneratorError(f"{where}: unexpected <{tag}>")
        block_length = int(el.get("blockLength", cursor))
        if block_length < cursor:
            raise GeneratorError(f"{self.filename}: {owner}: blockLength {block_length} < fields' {cursor}")
        return fields, groups, var_data, block_length

    def _field(self, where: str, parsed: Any, el: Any, cursor: int) -> FieldDef:
        kind = parsed.type
        optional = el.get("presence") == "optional"
        enum = None
        length = 1
        null: int | bytes
        if el.get("presence") == "constant":
            raise GeneratorError(f"{where}: constant fields are not supported")
        if isinstance(kind, sbe.PrimitiveType):
            primitive = PRIMITIVES[kind.value]
            null = primitive.null
        elif isinstance(kind, sbe.Enum):
            enum = self.enums[kind.name]
            primitive = enum.primitive
            null = enum.null
        elif isinstance(kind, sbe.Type):
            primitive = PRIMITIVES[kind.primitiveType.value]
            null = kind.nullValue if isinstance(kind.nullValue, int) else primitive.null
            optional = optional or kind.presence == sbe.Presence.OPTIONAL
            if kind.presence == sbe.Presence.CONSTANT:
                raise GeneratorError(f"{where}: constant types are not supported")
            length = int(self.xml_types[kind.name].get("length", "1"))
        else:
            raise GeneratorError(f"{where}: unsupported field type {kind!r}")
        if length < 1:
            raise GeneratorError(f"{where}: array length {length}")
        if length > 1 or primitive.name == "char":
            null = bytes([primitive.null]) * length
        offset = int(el.get("offset", cursor))
        if offset < cursor:
            raise GeneratorError(f"{where}: offset {offset} overlaps the previous field (ends at {cursor})")
        return FieldDef(
            name=parsed.name,
            py=snake(parsed.name),
            id=int(el.get("id")),
            primitive=primitive,
            length=length,
            offset=offset,
            since_version=int(el.get("sinceVersion", "0")),
            optional=optional,
            null=null,
            enum=enum,
            description=el.get("description", ""),
        )

    def _var_data(self, where: str, parsed: Any, el: Any) -> VarDataDef:
        composite = parsed.type
        if not isinstance(composite, sbe.Composite):
            raise GeneratorError(f"{where}: <data> must use a composite type")
        names = [t.name for t in composite.types]
        if names != ["length", "varData"]:
            raise GeneratorError(f"{where}: var-data composite must be (length, varData), got {names}")
        length_primitive = PRIMITIVES[composite.types[0].primitiveType.value]
        xml_members = {m.get("name"): m for m in _elements(self.xml_types[composite.name])}
        max_length = int(xml_members["length"].get("maxValue", length_primitive.hi))
        encoding = xml_members["varData"].get("characterEncoding")
        if encoding not in (None, "US-ASCII", "ASCII"):
            raise GeneratorError(f"{where}: characterEncoding {encoding} is not supported")
        align = int(el.get(f"{{{FULMAR_NS}}}align", "0"))
        if align < 0 or align & (align - 1):
            raise GeneratorError(f"{where}: fulmar:align must be a power of two")
        return VarDataDef(
            name=parsed.name,
            py=snake(parsed.name),
            id=int(el.get("id")),
            since_version=int(el.get("sinceVersion", "0")),
            ascii=encoding is not None,
            length_primitive=length_primitive,
            max_length=min(max_length, length_primitive.hi),
            align=align if align > 1 else 0,
            description=el.get("description", ""),
        )

    def _group(self, where: str, owner_class: str, parsed: Any, el: Any) -> GroupDef:
        dimension = [(t.name, t.primitiveType.value) for t in parsed.dimensionType.types]
        if dimension != [("blockLength", "uint16"), ("numInGroup", "uint16")]:
            raise GeneratorError(f"{where}: group dimension must be u16 blockLength, u16 numInGroup")
        class_name = owner_class + upper_first(parsed.name)
        fields, groups, var_data, block_length = self._members(where, class_name, parsed.fields, el)
        return GroupDef(
            name=parsed.name,
            py=snake(parsed.name),
            id=int(el.get("id")),
            since_version=int(el.get("sinceVersion", "0")),
            class_name=class_name,
            block_length=block_length,
            fields=fields,
            groups=groups,
            var_data=var_data,
            description=el.get("description", ""),
        )


# --------------------------------------------------------------------------- emitting


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 0

    def __call__(self, text: str = "") -> None:
        self.lines.append(("    " * self.depth + text) if text else "")

    def block(self, text: str) -> _Indent:
        self(text)
        return _Indent(self)

    def text(self) -> str:
        text = "\n".join(self.lines).rstrip("\n") + "\n"
        return re.sub(r"\n{4,}", "\n\n\n", text)


class _Indent:
    def __init__(self, lines: _Lines) -> None:
        self.lines = lines

    def __enter__(self) -> None:
        self.lines.depth += 1

    def __exit__(self, *exc: object) -> None:
        self.lines.depth -= 1


Owner = MessageDef | GroupDef


def _struct_format(fields: list[FieldDef], block_length: int) -> str:
    fmt = "<"
    cursor = 0
    for f in fields:
        if f.offset > cursor:
            fmt += f"{f.offset - cursor}x"
        fmt += f.fmt
        cursor = f.offset + f.size
    if block_length > cursor:
        fmt += f"{block_length - cursor}x"
    return fmt


def _codec_expr(f: FieldDef) -> str:
    return f'struct.Struct("<{f.fmt}")' if f.is_array else f.primitive.codec


def _max_since(fields: list[FieldDef]) -> int:
    return max((f.since_version for f in fields), default=0)


def _py_type(f: FieldDef) -> str:
    return "bytes" if f.is_array else "int"


def _var_decode_type(v: VarDataDef) -> str:
    return "str" if v.ascii else "bytes"


def _var_encode_type(v: VarDataDef) -> str:
    return "str | bytes" if v.ascii else "bytes | bytearray | memoryview"


def _var_null(v: VarDataDef) -> str:
    return '""' if v.ascii else 'b""'


def _member_names(owner: Owner) -> list[str]:
    return [f.py for f in owner.fields] + [g.py for g in owner.groups] + [v.py for v in owner.var_data]


def _tuple(items: list[str]) -> str:
    if len(items) == 1:
        return f"({items[0]},)"
    return "(" + ", ".join(items) + ")"


def _docstring(lines: _Lines, text: str) -> None:
    text = text.strip().replace('"""', "'''")
    lines(f'"""{text}"""')


class _ModuleWriter:
    def __init__(self, schema: SchemaDef) -> None:
        self.schema = schema
        self.out = _Lines()
        self.framed = not schema.headerless

    def write(self) -> str:
        self._preamble()
        for enum in self.schema.enums:
            self._enum(enum)
        self._template_ids()
        self._bases()
        for message in self.schema.messages:
            self._message(message)
        self._dispatch()
        return self.out.text()

    # ------------------------------------------------------------- module level

    def _preamble(self) -> None:
        s, out = self.schema, self.out
        out('"""GENERATED FILE - DO NOT EDIT.')
        out()
        out("Generated by ``python -m fulmar.codecs.generate`` (``make codecs``) from")
        out(f"``codecs/schemas/{s.filename}``: {s.description}")
        out(f"Schema id {s.id}, version {s.version}, semantic version {s.semantic_version}.")
        out()
        if self.framed:
            example = self.schema.messages[0]
            args = ", ".join(f"{f.py}=..." for f in example.fields)
            out("Usage::")
            out()
            out(f"    length = {example.class_name}Encoder.encode(buf, offset, {args})")
            out(f"    decoder = {example.class_name}Decoder().wrap_and_apply_header(buf, offset, length)")
            out("    decoder = decode(buf, offset)            # any message, chosen by its template id")
            out()
            out("Messages are framed by the 8-byte SBE message header; ``encode`` writes header and")
            out("body, ``encode_headerless`` / ``wrap_headerless`` the body alone. Decoders honour the")
            out("acting block length and version: fields newer than the acting version read as their")
            out("null value, unknown trailing block bytes are skipped. Bad input raises CodecError.")
        else:
            out("HEADERLESS: no message header on the wire. Each message id is the ring-buffer")
            out("msg_type_id; ``encode`` writes the bare body and ``wrap_headerless(buf, offset,")
            out("length)`` / ``decode(msg_type_id, buf, offset, length)`` read it, where ``length``")
            out("is the record length. Bad input raises CodecError.")
        out('"""')
        out()
        has_groups = any(m.groups for m in s.messages)
        out("from __future__ import annotations")
        out()
        out("import struct")
        if has_groups:
            out("from collections.abc import Mapping, Sequence")
        out("from enum import IntEnum")
        out("from typing import Any, Self" if has_groups else "from typing import Self")
        out()
        out("from .. import runtime as _rt")
        if not self.framed:
            out("from ..errors import CodecError")
        runtime_names = ["ReadableBuffer", "WritableBuffer"]
        runtime_names += ["GroupEntry"] if has_groups else []
        runtime_names += ["MessageHeader"] if self.framed else []
        out(f"from ..runtime import {', '.join(sorted(runtime_names))}")
        out()
        out("__all__ = [")
        with _Indent(out):
            names = ["SCHEMA_NAME", "SCHEMA_ID", "SCHEMA_VERSION", "SEMANTIC_VERSION", "TemplateId"]
            names += [e.name for e in s.enums]
            for m in s.messages:
                names += [f"{m.class_name}Decoder", f"{m.class_name}Encoder"]
                names += [g.class_name for g in _all_groups(m)]
            names += ["DECODERS", "ENCODERS", "decode"]
            if self.framed:
                names += ["HEADER_LENGTH", "read_header", "write_header"]
            for name in names:
                out(f'"{name}",')
        out("]")
        out()
        out(f'SCHEMA_NAME = "{s.module}"')
        out(f"SCHEMA_ID = {s.id}")
        out(f"SCHEMA_VERSION = {s.version}")
        out(f'SEMANTIC_VERSION = "{s.semantic_version}"')
        if self.framed:
            out("HEADER_LENGTH = _rt.HEADER_LENGTH")
        out()

    def _enum(self, enum: EnumDef) -> None:
        out = self.out
        out()
        with out.block(f"class {enum.name}(IntEnum):"):
            doc = enum.description or enum.name
            _docstring(out, f"{doc} Wire type {enum.primitive.name}; unknown values decode to UNKNOWN_<n> members.")
            out()
            for name, value in enum.values:
                out(f"{name} = {value}")
            out(f"NULL_VAL = {enum.null}")
            out()
            out("@classmethod")
            with out.block(f"def _missing_(cls, value: object) -> {enum.name} | None:"):
                out("return _rt.unknown_enum_member(cls, value)")
        out()

    def _template_ids(self) -> None:
        out = self.out
        out()
        with out.block("class TemplateId(IntEnum):"):
            if self.framed:
                _docstring(out, "Template ids of this schema.")
            else:
                _docstring(out, "Message ids of this schema: the ring-buffer / broadcast msg_type_id.")
            out()
            for m in self.schema.messages:
                out(f"{m.const} = {m.id}")
        out()

    def _bases(self) -> None:
        out = self.out
        base = "_rt.FramedMessageDecoder" if self.framed else "_rt.MessageDecoder"
        for name, parent in (("_Decoder", base), ("_Encoder", "_rt.MessageEncoder")):
            out()
            with out.block(f"class {name}({parent}):"):
                if name == "_Decoder":
                    out("__slots__ = ()")
                out("SCHEMA_NAME = SCHEMA_NAME")
                out("SCHEMA_ID = SCHEMA_ID")
                out("SCHEMA_VERSION = SCHEMA_VERSION")
            out()

    def _dispatch(self) -> None:
        out, s = self.out, self.schema
        decoder_base = "_rt.FramedMessageDecoder" if self.framed else "_rt.MessageDecoder"
        out()
        with out.block(f"DECODERS: dict[int, type[{decoder_base}]] = {{"):
            for m in sorted(s.messages, key=lambda m: m.id):
                out(f"{m.id}: {m.class_name}Decoder,")
        out("}")
        out()
        with out.block("ENCODERS: dict[int, type[_rt.MessageEncoder]] = {"):
            for m in sorted(s.messages, key=lambda m: m.id):
                out(f"{m.id}: {m.class_name}Encoder,")
        out("}")
        out()
        if self.framed:
            out()
            with out.block(
                "def read_header(buf: ReadableBuffer, offset: int = 0, length: int | None = None) -> MessageHeader:"
            ):
                _docstring(out, "Decode the message header at ``offset``; CodecError if short or of another schema.")
                out("return _rt.read_header(SCHEMA_NAME, SCHEMA_ID, buf, offset, length)[0]")
            out()
            out()
            with out.block(
                "def write_header(buf: WritableBuffer, offset: int, block_length: int, template_id: int, "
                "version: int = SCHEMA_VERSION) -> int:"
            ):
                _docstring(out, "Write a message header of this schema; return its length.")
                out("return _rt.write_header(SCHEMA_NAME, buf, offset, block_length, template_id, SCHEMA_ID, version)")
            out()
            out()
            with out.block(
                "def decode(buf: ReadableBuffer, offset: int = 0, length: int | None = None) -> _rt.FramedMessageDecoder:"
            ):
                _docstring(out, "Decode the framed message at ``offset`` with a new decoder chosen by its template id.")
                out("return _rt.decode_framed(SCHEMA_NAME, SCHEMA_ID, DECODERS, buf, offset, length)")
        else:
            out()
            with out.block(
                "def decode(msg_type_id: int, buf: ReadableBuffer, offset: int = 0, "
                "length: int | None = None) -> _rt.MessageDecoder:"
            ):
                _docstring(out, "Decode a record body of type ``msg_type_id`` (``length``: the record length).")
                out("cls = DECODERS.get(msg_type_id)")
                with out.block("if cls is None:"):
                    out('raise CodecError(SCHEMA_NAME, None, None, f"unknown msg_type_id {msg_type_id:#x}")')
                out("return cls().wrap_headerless(buf, offset, length)")

    # ------------------------------------------------------------- per message

    def _message(self, m: MessageDef) -> None:
        out = self.out
        c = m.const
        out()
        out("# " + "-" * 75)
        out(f"# {m.name}: template {m.id}, root block {m.block_length} bytes")
        out()
        out(f'_{c} = _rt.Template(SCHEMA_NAME, "{m.name}", {m.id})')
        self._layout(f"_{c}", m.fields, m.block_length)
        if self.framed:
            frame = "<HHHH" + _struct_format(m.fields, m.block_length)[1:]
            out(f'_{c}_FRAME = struct.Struct("{frame}")')
        for g in m.groups:
            self._group(m, f"_{c}", g, g.name)
        if m.groups or m.var_data:
            self._tail_encoder(f"_{c}", f"_encode_{c.lower()}_tail", m)
        self._decoder(m)
        self._encoder(m)

    def _layout(self, prefix: str, fields: list[FieldDef], block_length: int) -> None:
        out = self.out
        out(f'{prefix}_BLOCK = struct.Struct("{_struct_format(fields, block_length)}")')
        with out.block(f"{prefix}_LAYOUT = ("):
            for f in fields:
                out(f'_rt.FieldLayout("{f.name}", {_codec_expr(f)}, {f.offset}, {f.since_version}, {f.null!r}),')
        out(")")

    def _class_header(self, owner: Owner, doc: str) -> None:
        out = self.out
        slots = [f.slot for f in owner.fields] + [g.py for g in owner.groups] + [v.py for v in owner.var_data]
        _docstring(out, doc)
        out()
        out(f"__slots__ = {_tuple([repr(s).replace(chr(39), chr(34)) for s in slots])}")
        out()

    def _attribute_annotations(self, owner: Owner) -> None:
        out = self.out
        for f in owner.fields:
            out(f"{f.slot}: {_py_type(f)}")
        for g in owner.groups:
            out(f"{g.py}: list[{g.class_name}]")
        for v in owner.var_data:
            out(f"{v.py}: {_var_decode_type(v)}")
        if owner.fields or owner.groups or owner.var_data:
            out()

    def _enum_properties(self, owner: Owner) -> None:
        out = self.out
        for f in owner.fields:
            if f.enum:
                out("@property")
                with out.block(f"def {f.py}(self) -> {f.enum.name}:"):
                    out(f"return {f.enum.name}(self.{f.slot})")
                out()

    def _read_members(self, t: str, owner: Owner, pos: str, acting_version: str) -> None:
        """Emit reads of groups and var data following a block (``pos`` is a local)."""
        out = self.out
        target = "entry" if isinstance(owner, GroupDef) else "self"
        for g in owner.groups:
            call = f"{target}.{g.py}, {pos} = _decode_{g.class_name}(buf, {pos}, end, {acting_version})"
            if g.since_version:
                with out.block(f"if {acting_version} >= {g.since_version}:"):
                    out(call)
                with out.block("else:"):
                    out(f"{target}.{g.py} = []")
            else:
                out(call)
        for v in owner.var_data:
            reader = "read_ascii" if v.ascii else "read_bytes"
            codec = v.length_primitive.codec
            call = f'{target}.{v.py}, {pos} = _rt.{reader}({t}, "{v.name}", buf, {pos}, end, {codec}, {v.align})'
            if v.since_version:
                with out.block(f"if {acting_version} >= {v.since_version}:"):
                    out(call)
                with out.block("else:"):
                    out(f"{target}.{v.py} = {_var_null(v)}")
            else:
                out(call)

    def _decoder(self, m: MessageDef) -> None:
        out = self.out
        c = m.const
        out()
        with out.block(f"class {m.class_name}Decoder(_Decoder):"):
            doc = f"{m.description} Template {m.id}; root block {m.block_length} bytes."
            if m.since_version:
                doc += f" Since version {m.since_version}."
            if m.deprecated is not None:
                doc += f" Deprecated since version {m.deprecated}."
            self._class_header(m, doc)
            out(f"TEMPLATE_ID = {m.id}")
            out(f'NAME = "{m.name}"')
            out(f"BLOCK_LENGTH = {m.block_length}")
            out(f"SINCE_VERSION = {m.since_version}")
            out(f"FIELD_NAMES = {_tuple([chr(34) + n + chr(34) for n in _member_names(m)])}")
            out()
            self._attribute_annotations(m)
            with out.block("def __init__(self) -> None:"):
                out("super().__init__()")
                for f in m.fields:
                    out(f"self.{f.slot} = {f.null!r}")
                for g in m.groups:
                    out(f"self.{g.py} = []")
                for v in m.var_data:
                    out(f"self.{v.py} = {_var_null(v)}")
            out()
            self._enum_properties(m)
            signature = (
                "def wrap(self, buf: ReadableBuffer, offset: int, "
                f"acting_block_length: int = {m.block_length}, acting_version: int = {self.schema.version}, "
                "length: int | None = None) -> Self:"
            )
            with out.block(signature):
                _docstring(
                    out,
                    "Decode the body at ``offset`` (after any header); ``length`` bounds it (default: to the end).",
                )
                out("size = len(buf)")
                out("end = size if length is None else offset + length")
                with out.block(
                    "if offset < 0 or end > size or acting_block_length < 0 or offset + acting_block_length > end:"
                ):
                    out(f"raise _rt.span_error(_{c}, _{c}_LAYOUT, size, offset, length, acting_block_length)")
                if m.fields:
                    targets = _tuple([f"self.{f.slot}" for f in m.fields])
                    condition = f"acting_block_length >= {m.block_length}"
                    if _max_since(m.fields):
                        condition += f" and acting_version >= {_max_since(m.fields)}"
                    with out.block(f"if {condition}:"):
                        out(f"{targets} = _{c}_BLOCK.unpack_from(buf, offset)")
                    with out.block("else:"):
                        out(
                            f"{targets} = _rt.unpack_versioned("
                            f"_{c}, _{c}_LAYOUT, buf, offset, acting_block_length, acting_version)"
                        )
                if m.groups or m.var_data:
                    out("pos = offset + acting_block_length")
                    self._read_members(f"_{c}", m, "pos", "acting_version")
                    out("self.sbe_encoded_length = pos - offset")
                else:
                    out("self.sbe_encoded_length = acting_block_length")
                out("self.sbe_acting_block_length = acting_block_length")
                out("self.sbe_acting_version = acting_version")
                out("return self")
        out()

    def _encode_params(self, owner: Owner) -> list[str]:
        params = []
        for f in owner.fields:
            default = f" = {f.null!r}" if f.optional else ""
            params.append(f"{f.py}: {_py_type(f)}{default}")
        for g in owner.groups:
            params.append(f"{g.py}: Sequence[Mapping[str, Any] | GroupEntry] = ()")
        for v in owner.var_data:
            params.append(f"{v.py}: {_var_encode_type(v)} = {_var_null(v)}")
        return params

    def _tail_params(self, owner: Owner) -> list[str]:
        params = []
        for g in owner.groups:
            params.append(f"{g.py}: Sequence[Mapping[str, Any] | GroupEntry]")
        for v in owner.var_data:
            params.append(f"{v.py}: {_var_encode_type(v)}")
        return params

    def _write_members(self, t: str, owner: Owner) -> None:
        """Emit writes of groups then var data at local ``pos``."""
        out = self.out
        for g in owner.groups:
            out(f"pos = _encode_{g.class_name}(buf, pos, {g.py})")
        for v in owner.var_data:
            writer = "write_ascii" if v.ascii else "write_bytes"
            codec = v.length_primitive.codec
            out(f'pos = _rt.{writer}({t}, "{v.name}", buf, pos, {v.py}, {codec}, {v.max_length}, {v.align})')

    def _tail_encoder(self, t: str, name: str, m: MessageDef) -> None:
        out = self.out
        out()
        out()
        params = ", ".join(["buf: WritableBuffer", "pos: int"] + self._tail_params(m))
        with out.block(f"def {name}({params}) -> int:"):
            self._write_members(t, m)
            out("return pos")
        out()

    def _encoder(self, m: MessageDef) -> None:
        out = self.out
        c = m.const
        values = [f.py for f in m.fields]
        tail_args = ", ".join([g.py for g in m.groups] + [v.py for v in m.var_data])
        fields = self._encode_params(m)
        params = ", ".join(["buf: WritableBuffer", "offset: int"] + (["*"] + fields if fields else []))
        out()
        with out.block(f"class {m.class_name}Encoder(_Encoder):"):
            _docstring(out, f"Encoders of {m.name} (template {m.id}); all fields are keyword arguments.")
            out()
            out(f"TEMPLATE_ID = {m.id}")
            out(f'NAME = "{m.name}"')
            out(f"BLOCK_LENGTH = {m.block_length}")
            variants = [("encode", self.framed)]
            if self.framed:
                variants.append(("encode_headerless", False))
            for method, with_header in variants:
                out()
                out("@staticmethod")
                with out.block(f"def {method}({params}) -> int:"):
                    if with_header:
                        _docstring(
                            out, "Write the message header and the message at ``offset``; return the bytes written."
                        )
                        struct_name = f"_{c}_FRAME"
                        head = [str(m.block_length), str(m.id), "SCHEMA_ID", "SCHEMA_VERSION"]
                        block_at = "offset + HEADER_LENGTH"
                        fixed = f"HEADER_LENGTH + {m.block_length}"
                    else:
                        _docstring(out, "Write the message without a header at ``offset``; return the bytes written.")
                        struct_name = f"_{c}_BLOCK"
                        head = []
                        block_at = "offset"
                        fixed = str(m.block_length)
                    with out.block("if offset < 0:"):
                        out(f"raise _rt.negative_offset(_{c}, offset)")
                    with out.block("try:"):
                        out(f"{struct_name}.pack_into({', '.join(['buf', 'offset'] + head + values)})")
                    with out.block("except struct.error as ex:"):
                        out(
                            f"raise _rt.pack_error(_{c}, _{c}_LAYOUT, {_tuple(values) if values else '()'}, "
                            f"buf, {block_at}, {m.block_length}, ex) from None"
                        )
                    if m.groups or m.var_data:
                        out(f"return _encode_{c.lower()}_tail(buf, offset + {fixed}, {tail_args}) - offset")
                    else:
                        out(f"return {fixed}")
        out()

    # ------------------------------------------------------------- groups

    def _group(self, m: MessageDef, parent: str, g: GroupDef, path: str) -> None:
        out = self.out
        c = f"{parent}_{g.py.upper()}"
        out(f'{c} = _rt.Template(SCHEMA_NAME, "{m.name}", {m.id}, "{path}")')
        self._layout(c, g.fields, g.block_length)
        for sub in g.groups:
            self._group(m, c, sub, f"{path}.{sub.name}")
        out()
        out()
        with out.block(f"class {g.class_name}(GroupEntry):"):
            doc = f"One entry of group {g.name} in {m.name}; entry block {g.block_length} bytes."
            if g.description:
                doc = f"{g.description} {doc}"
            self._class_header(g, doc)
            out(f"BLOCK_LENGTH = {g.block_length}")
            out(f"FIELD_NAMES = {_tuple([chr(34) + n + chr(34) for n in _member_names(g)])}")
            out()
            self._attribute_annotations(g)
            self._enum_properties(g)
        out()
        # decoder of the group
        out()
        with out.block(
            f"def _decode_{g.class_name}(buf: ReadableBuffer, pos: int, end: int, acting_version: int) "
            f"-> tuple[list[{g.class_name}], int]:"
        ):
            out(
                f"block_length, count, pos = _rt.read_group_header({c}, None, buf, pos, end, {c}_LAYOUT, acting_version)"
            )
            condition = f"block_length >= {g.block_length}"
            if _max_since(g.fields):
                condition += f" and acting_version >= {_max_since(g.fields)}"
            out(f"complete = {condition}")
            out(f"entries: list[{g.class_name}] = []")
            with out.block("for index in range(count):"):
                with out.block("if end - pos < block_length:"):
                    out(f'raise {c}.error(None, f"entry {{index}} truncated: {{end - pos}} of {{block_length}} bytes")')
                out(f"entry = {g.class_name}.__new__({g.class_name})")
                if g.fields:
                    targets = _tuple([f"entry.{f.slot}" for f in g.fields])
                    with out.block("if complete:"):
                        out(f"{targets} = {c}_BLOCK.unpack_from(buf, pos)")
                    with out.block("else:"):
                        out(f"{targets} = _rt.unpack_entry({c}_LAYOUT, buf, pos, acting_version)")
                out("pos += block_length")
                self._read_members(c, g, "pos", "acting_version")
                out("entries.append(entry)")
            out("return entries, pos")
        out()
        # encoder of the group
        names = _member_names(g)
        defaults = []
        for f in g.fields:
            defaults.append(repr(f.null) if f.optional else "_rt.REQUIRED")
        defaults += ["()" for _ in g.groups]
        defaults += [_var_null(v) for v in g.var_data]
        out()
        out(f"{c}_NAMES = {_tuple([chr(34) + n + chr(34) for n in names])}")
        out(f"{c}_DEFAULTS = {_tuple(defaults)}")
        out()
        out()
        with out.block(
            f"def _encode_{g.class_name}(buf: WritableBuffer, pos: int, "
            f"entries: Sequence[Mapping[str, Any] | GroupEntry]) -> int:"
        ):
            out(f"pos = _rt.write_group_header({c}, None, buf, pos, {g.block_length}, len(entries))")
            with out.block("for entry in entries:"):
                out(f"{_tuple(names)} = _rt.entry_values({c}, entry, {c}_NAMES, {c}_DEFAULTS)")
                values = [f.py for f in g.fields]
                with out.block("try:"):
                    out(f"{c}_BLOCK.pack_into({', '.join(['buf', 'pos'] + values)})")
                with out.block("except struct.error as ex:"):
                    out(
                        f"raise _rt.pack_error({c}, {c}_LAYOUT, {_tuple(values) if values else '()'}, "
                        f"buf, pos, {g.block_length}, ex) from None"
                    )
                out(f"pos += {g.block_length}")
                self._write_members(c, g)
            out("return pos")
        out()


def _all_groups(owner: Owner) -> Iterator[GroupDef]:
    for g in owner.groups:
        yield g
        yield from _all_groups(g)


# --------------------------------------------------------------------------- driver


def render(schema: SchemaDef) -> str:
    """Python source of the generated module for one schema."""
    return _ModuleWriter(schema).write()


def render_all(schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """File name -> content of every generated file (including the package __init__)."""
    files = {}
    modules = []
    for schema in load_all(schema_dir):
        files[f"{schema.module}.py"] = render(schema)
        modules.append(schema.module)
    init = [
        '"""GENERATED FILE - DO NOT EDIT. Codecs generated from codecs/schemas/ by fulmar.codecs.generate.',
        "",
        "Import the module you need (``from fulmar.codecs.generated import cluster``); they are",
        "not imported eagerly, so a process pays only for the protocols it speaks.",
        '"""',
        "",
        "__all__ = [" + ", ".join(f'"{m}"' for m in modules) + "]",
    ]
    files["__init__.py"] = "\n".join(init) + "\n"
    return files


def write_all(out_dir: Path, schema_dir: Path = SCHEMA_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(schema_dir).items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_files(out_dir: Path = GENERATED_DIR, schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """Generated files whose content differs from what the schemas produce now: name -> unified diff."""
    stale = {}
    for name, text in render_all(schema_dir).items():
        path = out_dir / name
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current != text:
            diff = difflib.unified_diff(
                current.splitlines(keepends=True), text.splitlines(keepends=True), f"{path} (on disk)", "(generated)"
            )
            stale[name] = "".join(diff)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fulmar.codecs.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=GENERATED_DIR, help="output directory (default: codecs/generated)")
    parser.add_argument("--check", action="store_true", help="do not write; exit 1 if the output is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        for name, diff in stale.items():
            print(f"stale: {name}", file=sys.stderr)
            print(diff[:4000], file=sys.stderr)
        return 1 if stale else 0
    for path in write_all(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
