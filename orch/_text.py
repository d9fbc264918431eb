"""Text from elsewhere (a remote host, a traceback, a file in a run root), made safe to show;
and numbers as every view writes them (:func:`number_text`, :func:`value_text`, :func:`nonfinite_words`,
:func:`rate_text`, :func:`size_text`)."""

from __future__ import annotations

import html
import math
import numbers
import re
from typing import Any

# Terminal control sequences, whole: CSI (ESC [ or 0x9b ... final byte), OSC, DCS, SOS, PM and
# APC strings (up to BEL or ST), other two-byte escapes; then any other C0/C1 control but
# newline and tab, and DEL.
_CONTROL = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"
)

# Unicode's format controls (category Cf: bidi embeddings, overrides and isolates such as
# U+202E, zero-width characters, tag characters) and its line and paragraph separators: they
# reorder or hide the text around them in a terminal and in a browser alike, so that a host
# name or a config value can read as something else. They are shown as their escape (\u202e).
_FORMAT = re.compile(
    "[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f]"
)


def _escape_format(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def visible(text: str) -> str:
    """``text`` with Unicode format controls and line separators written as their escapes."""
    return _FORMAT.sub(_escape_format, text)


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` without terminal control sequences: what a remote host or traceback says is shown,
    never obeyed (a host name can carry an escape that retitles or clears the terminal), and
    with Unicode format controls (U+202E, ...) written as escapes (:func:`visible`).

    ``one_line`` also turns newlines and tabs into spaces, for a field of one table row.
    """
    text = visible(_CONTROL.sub("", text))
    return text.replace("\n", " ").replace("\t", " ") if one_line else text


def escape_html(text: str, quote: bool = True) -> str:
    """``text`` for an HTML page: :func:`printable` (a browser obeys Unicode's format controls as
    a terminal does), then its markup escaped (``html.escape``)."""
    return html.escape(printable(text), quote)


def size_text(n: float) -> str:
    """A number of bytes as people read it: ``21.9 GB``, ``310 MB`` (decimal units, as ``free -h``
    does not but disk and cloud vendors do; one form everywhere orch shows memory)."""
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def number_text(value: float | None, digits: int = 4) -> str:
    """A measured number (a loss, a metric) as people read it, one form in every view: ``digits``
    significant digits, never fixed decimals, so that a small loss does not read 0.0000:
    ``1.068e-06``, ``0.01234``, ``123.4``, ``6.433e+35``; ``nan``, ``inf``, ``-inf`` as they
    are; ``-`` for none."""
    if value is None:
        return "-"
    value = float(value)
    if not math.isfinite(value):
        return str(value)
    return f"{value:.{digits}g}"


def value_text(value: Any) -> str:
    """A config value as every view writes it (a sweep's rows, its plot's legend, its best run,
    its results): a float as :func:`number_text` (``lr=0.4457``, not ``lr=0.4457453393648168``),
    an int, a bool and a string as they are."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):  # numpy's too
        return number_text(float(value))
    return str(value)


def config_text(config: dict[str, Any]) -> str:
    """A config as its runs are named: ``lr=0.4457, batch=32``."""
    return ", ".join(f"{k}={value_text(v)}" for k, v in config.items())


def nonfinite_words(
    value: float, step: int, last_finite: float | None, last_finite_step: int, stays: bool
) -> str:
    """Where a metric went NaN or inf, in the words of every view, live and recorded (the
    sweep's rows, its results, the run panel, ``orch show``): the value it became at the step
    it became so, ``inf from step 10 (last finite 6.433e+35 at step 9)``; one that came back:
    ``inf at step 10``."""
    if not stays:
        return f"{number_text(value)} at step {step}"
    text = f"{number_text(value)} from step {step}"
    if last_finite is not None:
        text += f" (last finite {number_text(last_finite)} at step {last_finite_step})"
    return text


def rate_text(steps_per_sec: float) -> str:
    """Steps per second: three significant digits (``0.0412``, ``12.5``, ``2340``); ``-`` for none."""
    if not steps_per_sec or not math.isfinite(steps_per_sec):
        return "-"
    return f"{steps_per_sec:.3g}" if steps_per_sec < 1000 else f"{steps_per_sec:.0f}"
