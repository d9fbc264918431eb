"""Text from elsewhere (a remote host, a traceback, a file in a run root), made safe to show."""

from __future__ import annotations

import re

# Terminal control sequences, whole: CSI (ESC [ or 0x9b ... final byte), OSC, DCS, SOS, PM and
# APC strings (up to BEL or ST), other two-byte escapes; then any other C0/C1 control but
# newline and tab, and DEL.
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` without terminal control sequences: what a remote host or traceback says is shown,
    never obeyed (a host name can carry an escape that retitles or clears the terminal).

    ``one_line`` also turns newlines and tabs into spaces, for a field of one table row.
    """
    text = _CONTROL.sub("", text)
    return text.replace("\n", " ").replace("\t", " ") if one_line else text


def size_text(n: float) -> str:
    """A number of bytes as people read it: ``21.9 GB``, ``310 MB`` (decimal units, as ``free -h``
    does not but disk and cloud vendors do; one form everywhere orch shows memory)."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"
