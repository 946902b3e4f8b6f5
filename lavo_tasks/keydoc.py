"""The meaning of each config key, from the comments of the YAML files that define it.

A key's meaning is the comment on its own line (`  seq_len: 96   # encoder input steps`);
comment lines below it that continue the text are left to the file.
"""

import re
from importlib import resources

_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):(?P<rest>.*)$")


def key_comments(relative_path: str) -> dict[str, str]:
    """{dotted key: its inline comment} of a YAML file shipped in lavo_tasks.configs."""
    text = (resources.files("lavo_tasks.configs") / relative_path).read_text(encoding="utf-8")
    comments, stack = {}, []  # stack: (indent, key) of the groups the current line is in
    for line in text.splitlines():
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
