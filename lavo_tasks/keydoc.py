"""The meaning of each config key, from the comments of the YAML files that define it.

A key's meaning is the comment on its own line (`  seq_len: 96   # encoder input steps`)
and the comment-only lines right below it that are indented deeper than the key (the
comment wrapped over several lines); a comment line at the key's own indent or less is
about what follows it, not a continuation. The lines are kept as lines (joined by "\\n").
"""

import re
from importlib import resources

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")
_COMMENT_LINE = re.compile(r"^(?P<indent> *)#(?P<text>.*)$")


def key_comments(relative_path: str) -> dict[str, str]:
    """{dotted key: its comment} of a YAML file shipped in lavo_tasks.configs."""
    text = (resources.files("lavo_tasks.configs") / relative_path).read_text(encoding="utf-8")
    return parse_key_comments(text)


def parse_key_comments(text: str) -> dict[str, str]:
    """{dotted key: its comment} of YAML text (see the module docstring)."""
    comments, stack = {}, []  # stack: (indent, key) of the groups the current line is in
    open_key = None  # (dotted key, its indent) while comment lines may continue its comment
    for line in text.splitlines():
        continued = _COMMENT_LINE.match(line)
        if continued and open_key and len(continued["indent"]) > open_key[1]:
            comments[open_key[0]] += "\n" + continued["text"].strip()
            continue
        open_key = None
        match = _KEY_LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([*(key for _, key in stack), match["key"]])
        comment = _inline_comment(match["rest"])
        if comment:
            comments[path] = comment
            open_key = (path, indent)
        stack.append((indent, match["key"]))
    return comments


def _inline_comment(rest: str) -> str:
    """The text after the first `#` outside quotes."""
    quote = None
    for i, char in enumerate(rest):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or rest[i - 1] in " \t"):
            return rest[i + 1:].strip()
    return ""
