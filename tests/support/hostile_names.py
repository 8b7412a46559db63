"""Names a hostile config, results folder or trace can carry, fed to every sink the same way."""

from __future__ import annotations

FORMULAS = [
    '=HYPERLINK("http://evil","x")',
    "+cmd|' /C calc'!A0",
    "-2+3+cmd|' /C calc'!A0",
    "@SUM(1+1)*cmd|' /C calc'!A0",
    "\tx=1",
]
"""What a spreadsheet runs as a formula (OWASP's CSV injection list)."""

SHELL = [
    "a b",
    "$(touch owned)",
    "`touch owned`",
    "x'; touch owned; '",
    'x"; touch owned; "',
    "back\\slash",
    "#not-a-comment",
    "100%j",
]
"""One line each, but every shell and sbatch metacharacter."""

LINE_BREAKS = [
    "exp\nimport os; os.system('touch owned')",
    "exp\r#SBATCH --nodes=999",
    "nul\x00byte",
    "u\u2028line",
]
"""No quoting keeps these on one line of a script: refused there."""

TERMINAL = ["exp\x1b]0;owned\x07", "exp\x1b[2J", "a\u202eevil"]

HTML = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "</script><svg onload=alert(1)>",
]
"""Markup: a page that took one as HTML would run it (in a table, an attribute, a script)."""

ONE_LINE = [*FORMULAS[:-1], *SHELL, *TERMINAL, *HTML]
"""Names that every sink must carry as they are (quoted or escaped, never refused)."""
