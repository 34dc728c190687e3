"""Image sizes on the command line: one convention for every tool.

argparse has no notion of a size; each tool used to take its own form
(``--shape H W``, ``--input-size``, ``800,1333``).  Here sizes are written as
mmdet's and mmseg's scales are, ``WIDTHxHEIGHT`` (or ``N`` for ``NxN``), and
become ``(height, width)``, the order of a tensor.  :func:`add_size_option`
adds such an option, refuses two numbers where one size is expected, and turns
a tool's old size option into one error line that names the new one.
"""
import argparse
import re
import sys
from typing import Any, Sequence, Tuple

#: how every tool writes an input size (width first, as mmdet's and mmseg's scales do)
SIZE_CONVENTION = 'sizes are WIDTHxHEIGHT, e.g. 1333x800, or N for NxN'
_SIZE = re.compile(r'(\d+)(?:[xX](\d+))?')


def parse_size(text: str) -> Tuple[int, int]:
    """An input size as the tools take it -> ``(height, width)``, the order of a tensor.

    ``'1333x800'`` is width x height, as mmdet's and mmseg's scales write it:
    ``(800, 1333)``; a bare ``'N'`` is ``NxN``.  Usable as an argparse ``type=``:
    anything else (``'800,1333'``, ``'0x5'``) raises ``ArgumentTypeError`` naming
    the convention.
    """
    match = _SIZE.fullmatch(str(text).strip())
    if match is None or min(int(v) for v in match.groups() if v is not None) < 1:
        raise argparse.ArgumentTypeError(f'invalid size {text!r}: {SIZE_CONVENTION}')
    width = int(match.group(1))
    height = int(match.group(2) or width)
    return height, width


def format_size(size: Sequence[int]) -> str:
    """``(height, width)`` -> ``'WIDTHxHEIGHT'``, the inverse of :func:`parse_size`."""
    height, width = size
    return f'{width}x{height}'


class _OneSizeAction(argparse.Action):
    """Stores one size; its parser refuses ``--size 1333 800`` (two numbers) before parsing."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)


class _RenamedSizeAction(argparse.Action):
    """An option that took another size form: one error line naming its replacement."""

    def __init__(self, option_strings, dest, replacement: str = '', **kwargs):
        kwargs.update(nargs='*', help=argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f'{option_string} is now {self.replacement}: {SIZE_CONVENTION}')


def _refuse_two_token_sizes(parser: argparse.ArgumentParser, flags: Sequence[str]) -> None:
    """Make ``parser`` refuse ``--size W H`` (two numbers where one size is expected).

    argparse would take the second number for a positional argument or report it
    as unrecognised, neither of which names the convention.  A bare number after
    the size is never a config, checkpoint or image path of these tools.  The
    check wraps the parser's public ``parse_known_args`` (which ``parse_args``
    calls) once; the wrapper keeps the set of one-size flags.
    """
    size_flags = getattr(parser.parse_known_args, 'inline_mm_size_flags', None)
    if size_flags is not None:  # wrapped already: one more flag to check
        size_flags.update(flags)
        return
    size_flags = set(flags)
    parse_known_args = parser.parse_known_args

    def checked(args=None, namespace=None):
        tokens = list(sys.argv[1:] if args is None else args)
        for i, token in enumerate(tokens):
            if token == '--':
                break
            flag, eq, value = token.partition('=')
            if flag not in size_flags:
                continue
            if not eq:
                value = tokens[i + 1] if i + 1 < len(tokens) else ''
            after = tokens[i + 1 if eq else i + 2:][:1]
            if after and after[0].isdigit() and _SIZE.fullmatch(value):
                parser.error(f'argument {flag}: one size expected, got {value!r} '
                             f'{after[0]!r}: {SIZE_CONVENTION}')
        return parse_known_args(args, namespace)

    checked.inline_mm_size_flags = size_flags  # type: ignore[attr-defined]
    parser.parse_known_args = checked  # type: ignore[method-assign]


def add_size_option(parser: argparse.ArgumentParser, *flags: str, default: Any = None,
                    many: bool = False, help: str = '', replaces: Sequence[str] = (),
                    **kwargs: Any) -> argparse.Action:
    """``--size WxH`` (``many=False``) or ``--sizes WxH ...`` parsed by :func:`parse_size`.

    The value is ``(height, width)`` (a list of them with ``many``); ``default``
    may be written as the user would (``'800x800'``, ``['224', '1333x800']``).
    ``replaces`` names old options of the tool that took sizes in another form
    (``--shape H W``): they stop with one error line naming the new option.
    """
    metavar = 'WxH'
    text = f'{help} ({SIZE_CONVENTION})' if help else SIZE_CONVENTION
    if isinstance(default, str):
        default = parse_size(default)
    elif many and default is not None:
        default = [parse_size(d) if isinstance(d, str) else tuple(d) for d in default]
    if many:
        action = parser.add_argument(*flags, type=parse_size, nargs='+', default=default,
                                     metavar=metavar, help=text, **kwargs)
    else:
        action = parser.add_argument(*flags, type=parse_size, default=default,
                                     action=_OneSizeAction, metavar=metavar, help=text,
                                     **kwargs)
        _refuse_two_token_sizes(parser, action.option_strings)
    for old in replaces:
        parser.add_argument(old, action=_RenamedSizeAction, dest=argparse.SUPPRESS,
                            replacement=f'{flags[0]} {metavar}' + (' ...' if many else ''))
    return action
