"""The one escaping rule per sink (torchscale/escaping.py), fed the same hostile names."""

from __future__ import annotations

import ast
import shlex
import subprocess

import pytest

from torchscale.escaping import (
    UnsafeValue,
    for_csv,
    for_terminal,
    python_comment,
    python_string,
    shell_line,
    shell_word,
)

HOSTILE = [
    "exp\x1b]0;owned\x07",  # OSC: sets the window title
    "exp\x1b[2J",  # clears the screen
    "\x1b]52;c;aGVsbG8=\x07",  # OSC 52: writes the clipboard
    "a\u202eevil",  # right-to-left override
    "x\x9b31m",  # C1 control sequence introducer
]


@pytest.mark.parametrize("name", HOSTILE)
def test_no_control_character_reaches_the_terminal(name: str) -> None:
    shown = for_terminal(name)
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert "\u202e" not in shown
    assert "\\x1b" in shown or "\\u202e" in shown or "\\x9b" in shown or "\\x07" in shown


def test_terminal_keeps_plain_text_and_shows_newlines_escaped() -> None:
    assert for_terminal("resnet-tiny bs=8") == "resnet-tiny bs=8"
    assert for_terminal("a\nb") == "a\\nb"
    assert for_terminal("a\nb\x1b", keep_newlines=True) == "a\nb\\x1b"


@pytest.mark.parametrize(
    "name", ["=1+1", "+cmd|' /C calc'!A0", "-2+3+cmd", "@SUM(A1)", "\tx", "\rx"]
)
def test_csv_cells_that_a_spreadsheet_would_run_get_a_quote(name: str) -> None:
    assert for_csv(name) == "'" + name


def test_csv_leaves_numbers_and_plain_names_alone() -> None:
    assert for_csv(-3.5) == -3.5
    assert for_csv("-3.5") == "-3.5"
    assert for_csv("resnet50") == "resnet50"


@pytest.mark.parametrize("value", ["exp\nrm -rf /", "a\rb", "nul\x00", "x\u2028y"])
def test_a_line_break_never_reaches_a_shell_line(value: str) -> None:
    with pytest.raises(UnsafeValue, match="line break or NUL"):
        shell_word(value, "experiment_name")


def test_shell_words_round_trip_through_a_real_shell() -> None:
    words = ["printf", "%s|", "a b", "$(touch /tmp/x)", "'q'", "; echo hi"]
    out = subprocess.run(["sh", "-c", shell_line(words)], capture_output=True, text=True)
    assert out.stdout == "a b|$(touch /tmp/x)|'q'|; echo hi|"
    assert shlex.split(shell_line(words)) == words


def test_python_snippets_keep_a_name_a_string() -> None:
    name = 'x"\nimport os; os.system("echo owned")  #'
    literal = python_string(name)
    assert "\n" not in literal
    assert ast.literal_eval(literal) == name
    assert "\n" not in python_comment(name)
