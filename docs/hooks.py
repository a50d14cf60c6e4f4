"""MkDocs hooks of fulmar's documentation site (``mkdocs.yml``: ``hooks:``).

- The home page is README.md and the performance history is bench/HISTORY.md:
  both are added to the site as generated pages (``index.md``,
  ``performance-history.md``), their links to ``docs/`` pages made relative to
  the site, so neither text is copied by hand.
- ``configuration.md`` gets the configuration reference appended: every option
  of ``cluster-node`` and ``cluster-tool``, read from their click command
  trees, and the ``node.toml`` key of each, read from
  ``fulmar.cli.supervisor.build_options`` (the very mapping ``cluster-node
  start`` uses), so the reference cannot drift from the code.

Importing the click commands imports the processes' modules, and some of them
read integer constants of the C extension at import.  Where the extension is
not built (a documentation-only environment), ``_native_stand_in`` provides
those constants from the extension's own headers, parsed by cffi in ABI mode;
calling a native function there raises.  ``make docs`` and ``make test`` build
with the extension installed and do not use it.

``python docs/hooks.py`` prints the generated reference.
"""

from __future__ import annotations

import html
import inspect
import logging
import re
import runpy
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("mkdocs.hooks.fulmar")

# ---------------------------------------------------------------------------- pages from outside docs/

# (source in the repository, page in the site, [(link prefix in the source, in the site)])
_GENERATED_PAGES = (
    ("README.md", "index.md", (("docs/", ""), ("bench/HISTORY.md", "performance-history.md"))),
    ("bench/HISTORY.md", "performance-history.md", (("../docs/", ""), ("../README.md", "index.md"))),
)
# Links of the pages in docs/ to files outside it.
_DOCS_LINKS = (("../bench/HISTORY.md", "performance-history.md"), ("../README.md", "index.md"))


def _rewrite_links(markdown: str, prefixes: tuple[tuple[str, str], ...], depth: int = 0) -> str:
    """Markdown links ``](prefix...)`` with each prefix replaced (``depth``: the page's folder depth)."""
    up = "../" * depth
    for old, new in prefixes:
        markdown = markdown.replace(f"]({up}{old}", f"]({up}{new}")
    return markdown


def on_config(config: Any) -> Any:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # this checkout's fulmar, whatever is installed
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for source, page, prefixes in _GENERATED_PAGES:
        text = (ROOT / source).read_text()
        files.append(File.generated(config, page, content=_rewrite_links(text, prefixes)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src_uri = page.file.src_uri
    if page.file.generated_by is None:  # a page of docs/ (the generated ones are rewritten already)
        markdown = _rewrite_links(markdown, _DOCS_LINKS, depth=src_uri.count("/"))
    if src_uri == "configuration.md":
        markdown = markdown.rstrip("\n") + "\n\n" + configuration_reference()
    return markdown


# ---------------------------------------------------------------------------- the native stand-in


def _native_stand_in() -> None:
    """Install ``fulmar._native._fulmar_native`` from the headers when it is not built."""
    try:
        import fulmar._native  # noqa: F401
    except ImportError:
        pass
    else:
        return
    from cffi import FFI

    # the build script's own list of headers, in its order (cffi needs a
    # header after those whose types it names); run from its file because
    # importing fulmar._native is what fails here
    build = runpy.run_path(str(ROOT / "fulmar" / "_native" / "build.py"))
    headers = build["public_headers"]
    ffi = FFI()
    ffi.cdef("\n".join(path.read_text() for path in headers))
    constants = ffi.dlopen(None)

    class Lib:
        def __getattr__(self, name: str) -> Any:
            try:
                return getattr(constants, name)
            except (AttributeError, NotImplementedError):

                def not_built(*args: Any, **kwargs: Any) -> Any:
                    raise RuntimeError(f"fulmar's native extension is not built: {name} cannot run")

                return not_built

    module = types.ModuleType("fulmar._native._fulmar_native")
    module.ffi = ffi  # type: ignore[attr-defined]
    module.lib = Lib()  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    log.info("fulmar's native extension is not built: its constants come from the headers for the reference")


# ---------------------------------------------------------------------------- the configuration reference


def _text(value: str) -> str:
    """Help text as Markdown inline text: one line, no HTML, no emphasis, no table breaks."""
    value = " ".join(value.replace("\b", " ").split())
    value = html.escape(value, quote=False)
    return re.sub(r"([*_|`\\\[\]])", r"\\\1", value)


def _code(value: str) -> str:
    value = str(value).replace("|", "\\|")
    tick = "``" if "`" in value else "`"
    return f"{tick}{value}{tick}" if value else '`""`'


def _help_paragraphs(help_text: str | None) -> str:
    """A command's help: its paragraphs; a ``\\b`` paragraph (click's verbatim) as a code block."""
    blocks = []
    for paragraph in inspect.cleandoc(help_text or "").split("\n\n"):
        if paragraph.startswith("\b\n"):
            blocks.append("```text\n" + paragraph[2:].rstrip() + "\n```")
        elif paragraph.strip():
            blocks.append(_text(paragraph))
    return "\n\n".join(blocks)


def _type_text(param: Any) -> str:
    import click

    from fulmar.cli.options import Duration, IdleStrategyName, Size
    from fulmar.idle import IDLE_STRATEGY_NAMES

    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    param_type = param.type
    if isinstance(param_type, click.Choice):
        return "one of " + ", ".join(_code(str(choice)) for choice in param_type.choices)
    if isinstance(param_type, Size):
        return "size: " + _text(param_type.describe())
    if isinstance(param_type, Duration):
        if param_type.min_ns:
            from fulmar.cli.options import format_duration

            return f"duration, at least {_code(format_duration(param_type.min_ns))}"
        return "duration"
    if isinstance(param_type, IdleStrategyName):
        return "idle strategy: " + ", ".join(_code(name) for name in IDLE_STRATEGY_NAMES)
    if isinstance(param_type, (click.IntRange, click.FloatRange)):
        describe = getattr(param_type, "_describe_range", None)
        kind = "integer" if isinstance(param_type, click.IntRange) else "number"
        return f"{kind}, {_text(describe())}" if describe else kind
    if isinstance(param_type, click.Path):
        if param_type.dir_okay and not param_type.file_okay:
            return "directory"
        if param_type.file_okay and not param_type.dir_okay:
            return "file"
        return "path"
    return {"integer": "integer", "text": "text", "float": "number", "boolean": "true or false"}.get(
        param_type.name, _text(param_type.name)
    )


def _is_unset(value: Any) -> bool:
    # click 8.1 and 8.2 leave a default None; later versions use a sentinel object.
    return value is None or type(value).__name__ in ("Sentinel", "_Sentinel") or "UNSET" in repr(value)


def _default_text(param: Any) -> str:
    import click

    if param.required:
        return "required"
    if isinstance(param.show_default, str):
        return _text(param.show_default)
    default = param.default
    if isinstance(param, click.Option) and param.is_flag:
        if param.secondary_opts:
            return _code(param.opts[0] if default else param.secondary_opts[0])
        return "off" if not default else "on"
    if callable(default):
        return "computed"
    if _is_unset(default):
        return ""
    if isinstance(default, (list, tuple)):
        return ", ".join(_code(item) for item in default) if default else ""
    return _code(default)


def _option_name(param: Any) -> str:
    import click

    names = [*param.opts, *getattr(param, "secondary_opts", [])]
    if isinstance(param, click.Argument):
        return _code(param.human_readable_name)
    return " / ".join(_code(name) for name in names)


def _params(command: Any) -> list[Any]:
    return [param for param in command.params if param.name != "help"]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell or "" for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _command_section(
    title: str,
    command: Any,
    level: int,
    key_of: Any = None,
    key_header: str = "`node.toml` key",
    heading: bool = True,
) -> str:
    parts = [f"{'#' * level} `{title}`" if heading else "", _help_paragraphs(command.help)]
    params = _params(command)
    if params:
        header = ["option", "type", "default"] + ([key_header] if key_of else []) + ["what it does"]
        rows = []
        for param in params:
            env = f" (environment: {_code(param.envvar)})" if isinstance(param.envvar, str) else ""
            row = [_option_name(param), _type_text(param), _default_text(param)]
            if key_of:
                row.append(key_of(param))
            row.append(_text(getattr(param, "help", None) or "") + env)
            rows.append(row)
        parts.append(_table(header, rows))
    return "\n\n".join(part for part in parts if part)


def _walk(title: str, command: Any, level: int, seen: dict[int, str], heading: bool = True) -> list[str]:
    """The sections of a command and its subcommands; a command listed twice (the cluster
    verbs at the top of cluster-tool too) is described once and referred to after."""
    import click

    if id(command) in seen:
        first = seen[id(command)]
        anchor = re.sub(r"[^a-z0-9 -]", "", first.lower()).replace(" ", "-")
        return [f"{'#' * level} `{title}`\n\nThe same command as [`{first}`](#{anchor})."]
    seen[id(command)] = title
    sections = [_command_section(title, command, level, heading=heading)]
    if isinstance(command, click.Group):
        # groups first, so that a command found under a group and at the top is described under its group
        subcommands = sorted(command.commands.items(), key=lambda item: (not isinstance(item[1], click.Group), item[0]))
        for name, sub in subcommands:
            sections += _walk(f"{title} {name}", sub, min(level + 1, 4), seen)
    return sections


def configuration_reference() -> str:
    """The generated part of docs/configuration.md, as Markdown."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    _native_stand_in()
    from fulmar.cli import cluster_node, cluster_tool, supervisor

    node = cluster_node.main
    processes = {name: node.commands[name] for name in ("driver", "archive", "consensus", "service")}
    options = supervisor.build_options(processes)
    by_child_opt = {(option.section, option.child_opts[0]): option for option in options if option.child_opts}
    out = []

    # -- cluster-node start: every node.toml key --------------------------------
    start = node.commands["start"]
    out.append("## `cluster-node start` and `node.toml`")
    out.append(_help_paragraphs(start.help))
    own = [param for param in _params(start) if param.name in ("config_path", "local_members", "ingress_port")]
    out.append(
        "Options of `start` itself:\n\n"
        + _table(
            ["option", "type", "what it does"],
            [[_option_name(param), _type_text(param), _text(param.help or "")] for param in own],
        )
    )
    tables = {
        "node": "the node itself",
        "driver": "the options of `cluster-node driver`",
        "archive": "the options of `cluster-node archive`",
        "consensus": "the options of `cluster-node consensus`",
        "service": "the service, then the options of `cluster-node service`",
    }
    for section, what in tables.items():
        rows = []
        for option in options:
            if option.section != section:
                continue
            passes = _code(option.child_opts[0]) if option.child_opts else "the supervisor"
            if option.secret:
                passes = "its environment"
            env = _code(option.envvar) if option.envvar else ""
            rows.append(
                [
                    _code(option.key),
                    _code(option.flag),
                    "flag" if option.is_flag else _type_text(_ParamView(option)),
                    _code(option.default_text) if option.default_text is not None else "",
                    env,
                    passes,
                    _text(option.help),
                ]
            )
        out.append(f"### `[{section}]`: {what}")
        out.append(
            _table(
                ["key", "`start` flag", "type", "default", "environment", "handed to", "what it does"],
                rows,
            )
        )

    # -- the cluster-node commands -------------------------------------------------
    out.append("## `cluster-node`")
    out.append(_command_section("cluster-node", node, 3, heading=False))
    derived = supervisor._DERIVED  # the options cluster-node start sets itself

    def node_key(section: str) -> Any:
        def key_of(param: Any) -> str:
            option = by_child_opt.get((section, param.opts[0]))
            if option is not None:
                return _code(f"[{option.section}] {option.key}")
            if param.name in derived.get(section, ()):
                return "set by `start`"
            return ""

        return key_of

    for name in ("driver", "archive", "consensus", "service"):
        out.append(_command_section(f"cluster-node {name}", node.commands[name], 3, node_key(name)))

    def backup_key(param: Any) -> str:
        if param.name == "cluster_dir":
            return "`[backup] dir`, then `cluster/`"
        return _code(f"[backup] {param.name}")

    out.append(
        _command_section(
            "cluster-node cluster-backup", node.commands["cluster-backup"], 3, backup_key, "`backup.toml` key"
        )
    )
    out.append(_command_section("cluster-node backup", node.commands["backup"], 3))

    # -- cluster-tool ---------------------------------------------------------------
    out.append("## `cluster-tool`")
    out += _walk("cluster-tool", cluster_tool.main, 2, {}, heading=False)
    return "\n\n".join(part for part in out if part) + "\n"


class _ParamView:
    """What ``_type_text`` reads of a click parameter, for a start option."""

    def __init__(self, option: Any) -> None:
        self.type = option.param_type
        self.opts = [option.flag]


if __name__ == "__main__":
    print(configuration_reference())
