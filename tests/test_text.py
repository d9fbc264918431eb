"""Text from elsewhere, made safe to show: terminal escapes dropped, Unicode format controls
(bidi overrides and isolates, zero-width characters, tags) written as escapes."""

from __future__ import annotations

import sys
import unicodedata

from orch._text import escape_html, printable

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: "evil\u202egnp.exe" reads as "evilexe.png"


def test_every_format_control_and_separator_is_written_as_its_escape() -> None:
    hidden = [chr(c) for c in range(sys.maxunicode + 1) if unicodedata.category(chr(c)) in ("Cf", "Zl", "Zp")]
    assert RLO in hidden and "\u2066" in hidden and "\u200b" in hidden
    for ch in hidden:
        code = ord(ch)
        escape = f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        for shown in (printable(f"a{ch}b"), printable(f"a{ch}b", one_line=True), escape_html(f"a{ch}b")):
            assert ch not in shown and shown == f"a{escape}b", (hex(code), shown)


def test_a_bidi_override_in_a_host_name_shows_literally_in_a_terminal_and_a_page() -> None:
    host = f"evil{RLO}gnp.exe\x1b]0;pwned\x07<b>"
    assert printable(host, one_line=True) == "evil\\u202egnp.exe<b>"
    assert escape_html(host) == "evil\\u202egnp.exe&lt;b&gt;"  # markup escaped too
    assert printable("naïve ü 日本 ✓") == "naïve ü 日本 ✓"  # letters of every script pass as they are
