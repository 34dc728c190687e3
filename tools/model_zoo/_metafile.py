"""Minimal textual edits of the zoo's metafiles and README tables (every other byte kept):
a YAML round trip would reformat the whole file; these edits replace only the lines of
the keys they set, and :func:`check_metafile` reads the result back as YAML.
"""
import json
import re
from typing import Any, Dict, List, Optional, Tuple

import yaml

from inline_mm.errors import ConfigError

#: the marker line before the results table of a zoo README
TABLE_MARKER = '<!-- model-zoo-table -->'

_CELL_SPLIT = re.compile(r'(?<!\\)\|')


def _scalar(value: Any) -> str:
    """One YAML scalar: plain when it reads back as itself, else JSON-quoted."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if re.fullmatch(r'[A-Za-z0-9_./()\-][\w ./()@+,\-]*', text) and ': ' not in text \
            and yaml.safe_load(text) == text:
        return text
    return json.dumps(text)


def _yaml_lines(key: str, value: Any, indent: int) -> List[str]:
    """``key: value`` as block YAML at ``indent``, lists indented two more (the zoo's style)."""
    pad = ' ' * indent
    if isinstance(value, dict):
        return [f'{pad}{key}:'] + [ln for k, v in value.items()
                                   for ln in _yaml_lines(k, v, indent + 2)]
    if not isinstance(value, list):
        return [f'{pad}{key}: {_scalar(value)}']
    lines = [f'{pad}{key}:']
    for item in value:
        if isinstance(item, dict):
            sub = [ln for k, v in item.items() for ln in _yaml_lines(k, v, indent + 4)]
            lines += [f'{pad}  - ' + sub[0].lstrip()] + sub[1:]
        else:
            lines.append(f'{pad}  - {_scalar(item)}')
    return lines


def _block_end(lines: List[str], start: int, indent: int) -> int:
    """Index after the block that starts at ``lines[start]`` (deeper-indented lines)."""
    end = start + 1
    while end < len(lines):
        text = lines[end]
        if text.strip() and len(text) - len(text.lstrip()) <= indent:
            break
        end += 1
    while end > start + 1 and not lines[end - 1].strip():  # trailing blank lines stay out
        end -= 1
    return end


def _key_line(lines: List[str], start: int, key: str, indent: int) -> Optional[int]:
    pattern = re.compile(rf'^ {{{indent}}}{re.escape(key)}:(\s|$)')
    return next((i for i in range(start, len(lines)) if pattern.match(lines[i])), None)


def _set_key(lines: List[str], key: str, new: List[str], indent: int, start: int = 0
             ) -> List[str]:
    """``lines`` with the block of ``key`` replaced by ``new``, or ``new`` added at the end."""
    i = _key_line(lines, start, key, indent)
    if i is None:
        return lines + new
    return lines[:i] + new + lines[_block_end(lines, i, indent):]


def find_entry(text: str, name: str) -> Optional[Tuple[int, int, int]]:
    """(first line, end line, key indent) of the ``Models`` entry ``name``, or None."""
    lines = text.split('\n')
    for i, line in enumerate(lines):
        match = re.match(r'^(\s*)- Name:\s*(.+?)\s*$', line)
        if match and match.group(2).strip('\'"') == name and \
                any(ln.startswith('Models:') for ln in lines[:i]):  # not a collection
            dash = len(match.group(1))
            return i, _block_end(lines, i, dash), dash + 2
    return None


def set_metafile_entry(text: str, name: str, results: List[dict], weights: str,
                       metadata: Dict[str, Any]) -> str:
    """``text`` with the entry ``name``'s Results, Weights and Metadata keys set: a key's
    line and its deeper-indented lines replaced, a missing key added at the end of its block."""
    found = find_entry(text, name)
    if found is None:
        raise ConfigError(f'the metafile has no Models entry named {name!r}: add one')
    start, end, ind = found
    lines = text.split('\n')
    entry = lines[start:end]
    m = _key_line(entry, 1, 'Metadata', ind)
    if m is None:
        entry = entry + _yaml_lines('Metadata', metadata, ind)
    else:
        m_end = _block_end(entry, m, ind)
        block = entry[m + 1:m_end]
        for key, value in metadata.items():
            block = _set_key(block, key, _yaml_lines(key, value, ind + 2), ind + 2)
        entry = entry[:m + 1] + block + entry[m_end:]
    entry = _set_key(entry, 'Results', _yaml_lines('Results', results, ind), ind, 1)
    entry = _set_key(entry, 'Weights', _yaml_lines('Weights', weights, ind), ind, 1)
    return '\n'.join(lines[:start] + entry + lines[end:])


def check_metafile(old: str, new: str, name: str, results: List[dict], weights: str,
                   metadata: Dict[str, Any]) -> None:
    """Read ``new`` back: the entry holds what was written, every other entry is as in
    ``old``; else a ConfigError (a layout the line editor does not handle)."""
    before, after = yaml.safe_load(old), yaml.safe_load(new)
    models_before, models_after = _models(before), _models(after)
    entry = models_after.get(name) or {}
    wrong = [k for k, v in (('Results', results), ('Weights', weights)) if entry.get(k) != v]
    wrong += [f'Metadata.{k}' for k, v in metadata.items()
              if (entry.get('Metadata') or {}).get(k) != v]
    wrong += [f'the entry {k}' for k in sorted(set(models_before) | set(models_after))
              if k != name and models_after.get(k) != models_before.get(k)]
    if after.get('Collections') != before.get('Collections'):
        wrong.append('Collections')
    if wrong:
        raise ConfigError(
            f'rewriting the metafile entry {name} did not read back ({", ".join(wrong)} '
            f'differ from what was meant): nothing was written; give the entry one key per '
            f'line with two-space indents, or edit it by hand')


def _models(data: Optional[dict]) -> Dict[str, dict]:
    """The parsed ``Models`` entries by name; str(): YAML reads a name such as 2024 as a
    number, while the line editor (:func:`find_entry`) matches it as text."""
    return {str(m.get('Name')): m for m in (data or {}).get('Models') or []}


def entry_fields(text: str, name: str) -> dict:
    """The parsed metafile entry ``name`` (and its collection's fields under '_collection')."""
    data = yaml.safe_load(text) or {}
    entry = _models(data).get(name)
    if entry is None:
        raise ConfigError(f'the metafile has no Models entry whose Name reads as {name!r} '
                          f'(its line matched, its YAML did not): write the name on the '
                          f'"- Name:" line as plain text, without quotes')
    collection = next((c for c in data.get('Collections') or []
                       if c.get('Name') == entry.get('In Collection')), {})
    return dict(entry, _collection=collection)


def set_readme_row(text: str, config_link: str, cells: Dict[str, str], readme: str) -> str:
    """``text`` with the cells named by their column header set in the row whose first cell
    links ``config_link``, in the first table after the :data:`TABLE_MARKER` line."""
    lines = text.split('\n')
    if TABLE_MARKER not in lines:
        raise ConfigError(f'{readme} has no results table marked {TABLE_MARKER}: add the '
                          f'marker line before the table the results go into')
    i = lines.index(TABLE_MARKER) + 1
    while i < len(lines) and not lines[i].startswith('|'):
        i += 1
    header = [c.strip() for c in _CELL_SPLIT.split(lines[i])[1:-1]] if i < len(lines) else []
    missing = [name for name in cells if name not in header]
    if missing:
        raise ConfigError(f"{readme}: the results table has no column {missing[0]!r}")
    for j in range(i + 2, len(lines)):
        if not lines[j].startswith('|'):
            break
        parts = _CELL_SPLIT.split(lines[j])
        if f']({config_link})' in parts[1]:
            for name, cell in cells.items():
                parts[header.index(name) + 1] = f' {cell} '
            lines[j] = '|'.join(parts)
            return '\n'.join(lines)
    raise ConfigError(f'{readme}: the results table has no row for {config_link} '
                      f'(a first cell linking it): add the row')
