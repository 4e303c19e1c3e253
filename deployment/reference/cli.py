"""docs/reference/cli.md: every command of `orderflow`, from the click tree itself (the group is
handed in, so that the generators never import the CLI): each command's help and usage, its
arguments, and every option with its help and default."""

from __future__ import annotations

from collections.abc import Iterator

import click

from deployment.reference.markdown import code, document, inline, paragraphs

PROGRAM = "orderflow"

UNSET = getattr(click.core, "UNSET", None)
"""click's marker of an option given no default (None before click 8.3)."""


def commands(
    group: click.Command, ctx: click.Context | None = None
) -> Iterator[tuple[click.Context, click.Command]]:
    """Every visible command under `group` (itself first), depth first in listed order, each
    with a context whose `command_path` is its full name."""
    ctx = ctx or click.Context(group, info_name=PROGRAM, **group.context_settings)
    yield ctx, group
    if not isinstance(group, click.Group):
        return
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        child = click.Context(command, info_name=name, parent=ctx, **command.context_settings)
        yield from commands(command, child)


def options(command: click.Command, ctx: click.Context) -> list[click.Option]:
    """The options a user sees in `ctx` (its help option included)."""
    return [
        param
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and not param.hidden
    ]


def _names(option: click.Option, ctx: click.Context) -> str:
    names = " / ".join(", ".join(opts) for opts in (option.opts, option.secondary_opts) if opts)
    if option.is_flag or option.count:
        return names
    return f"{names} {option.make_metavar(ctx)}"


def _default(option: click.Option, ctx: click.Context) -> str | None:
    """The default as `--help` would show it, or None where there is nothing to show (no
    default, a plain flag, one computed at run time that says nothing of itself)."""
    if isinstance(option.show_default, str):
        return inline(option.show_default)
    default = option.get_default(ctx, call=False)
    if default is None or default is UNSET or callable(default) or default == ():
        return None
    if option.is_flag:
        if not option.secondary_opts:
            return None
        return code(option.opts[0] if default else option.secondary_opts[0])
    return code(str(default))


def _option(option: click.Option, ctx: click.Context) -> str:
    words = [code(_names(option, ctx)) + ":", inline(option.help or "")]
    if isinstance(option.type, click.types._NumberRangeBase):
        words.append(f"Range: {code(option.type._describe_range())}.")
    default = _default(option, ctx)
    if default:
        words.append(f"Default: {default}.")
    if option.envvar:
        envvars = [option.envvar] if isinstance(option.envvar, str) else option.envvar
        words.append("Environment: " + ", ".join(code(e) for e in envvars) + ".")
    if option.required:
        words.append("Required.")
    if option.multiple:
        words.append("Repeatable.")
    return "- " + " ".join(word for word in words if word)


def _arguments(command: click.Command, ctx: click.Context) -> str:
    rows = []
    for param in command.params:
        if isinstance(param, click.Argument):
            facts = ["required" if param.required else "optional"]
            if param.nargs != 1:
                facts.append("any number" if param.nargs == -1 else f"{param.nargs} values")
            rows.append(f"- {code(param.make_metavar(ctx))}: {', '.join(facts)}")
    return "\n".join(rows)


def _summary(command: click.Command) -> str:
    """A command's first paragraph (its help's, or its short help)."""
    return next(iter(paragraphs(command.help or command.short_help or "")), "")


def _section(ctx: click.Context, command: click.Command) -> list[str]:
    depth = min(max(ctx.command_path.count(" ") + 1, 2), 4)
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    blocks = [f"{'#' * depth} {code(ctx.command_path)}"]
    blocks += paragraphs(command.help or command.short_help or "")
    blocks.append(f"Usage: {code(usage)}")
    arguments = _arguments(command, ctx)
    if arguments:
        blocks += ["Arguments:", arguments]
    if isinstance(command, click.Group):
        listed = [
            f"- {code(sub.command_path)}: {_summary(child)}"
            for sub, child in commands(command, ctx)
            if sub.parent is ctx
        ]
        blocks += ["Commands:", "\n".join(listed)]
    blocks += ["Options:", "\n".join(_option(option, ctx) for option in options(command, ctx))]
    return blocks


def cli_page(group: click.Command) -> str:
    """The page's Markdown, for the `orderflow` group."""
    blocks = [
        "# Command-line reference",
        "Generated from the `orderflow` command's parser (`services/cli/`) by "
        "`orderflow deploy write`: edit the commands' docstrings and options, not this page. "
        "`orderflow COMMAND --help` says the same.",
    ]
    for ctx, command in commands(group):
        blocks += _section(ctx, command)
    return document(blocks)
