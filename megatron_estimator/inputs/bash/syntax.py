"""The syntax tree of a shell script: words and their parts, simple and compound commands."""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_estimator.inputs.bash.values import Origin


class ShellSyntaxError(Exception):
    def __init__(self, origin: Origin, message: str, code: str = "shell-syntax-error"):
        super().__init__(message)
        self.origin = origin
        self.message = message
        self.code = code


@dataclass
class Lit:
    text: str
    origins: tuple[Origin, ...]
    quoted: bool


@dataclass
class Param:
    name: str                       # NAME, a digit string, @, *, #, ?, $, !, 0
    origin: Origin
    spelling: str
    quoted: bool
    index: "Word | str | None" = None    # ${A[i]}: a word; '@' or '*'; None
    op: str | None = None           # ':-', '-', ':=', '=', ':+', '+', ':?', '?', '#', '##', '%', '%%',
                                    # '/', '//', '/#', '/%', '^', '^^', ',', ',,', 'len', 'substr', 'indirect'
    arg: "Word | None" = None
    arg2: "Word | None" = None      # ${x/pat/rep}: rep; ${x:off:len}: len


@dataclass
class Arith:
    expr: "Word"
    origin: Origin
    spelling: str
    quoted: bool


@dataclass
class CmdSub:
    source: tuple[str, tuple[Origin, ...]]
    origin: Origin
    spelling: str
    quoted: bool


@dataclass
class Word:
    parts: list
    origin: Origin
    raw: str

    def literal(self) -> str | None:
        """The word's text when it is one unquoted literal (reserved words, names)."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Lit) and not self.parts[0].quoted:
            return self.parts[0].text
        if not self.parts:
            return None
        if all(isinstance(p, Lit) for p in self.parts):
            if any(p.quoted for p in self.parts):
                return None
            return "".join(p.text for p in self.parts)
        return None

    def plain(self) -> str | None:
        """The word's text when it has no expansions (quotes allowed)."""
        if all(isinstance(p, Lit) for p in self.parts):
            return "".join(p.text for p in self.parts)
        return None


@dataclass
class Assign:
    name: str
    origin: Origin
    append: bool = False
    index: Word | None = None
    value: Word | None = None
    array: list | None = None        # list of Word or (index Word, value Word)
    raw: str = ""


@dataclass
class HereDoc:
    """The body of a here-document (``<<EOF`` / ``<<-EOF``), filled in by the lexer when it
    reaches the lines after the command; ``quoted``: the delimiter was quoted (``'EOF'``,
    ``"EOF"``, ``\\EOF``), so the body is not expanded; ``strip``: ``<<-`` (leading tabs removed)."""

    delimiter: str
    strip: bool
    quoted: bool
    text: str = ""
    origins: tuple = ()              # one Origin per character of text
    closed: bool = False             # the delimiter line was found


@dataclass
class Redirect:
    op: str
    target: Word | None
    origin: Origin
    heredoc: HereDoc | None = None   # for << and <<-


@dataclass
class Simple:
    assigns: list
    words: list
    redirects: list
    origin: Origin


@dataclass
class Pipeline:
    commands: list
    negate: bool
    origin: Origin
    raw: str = ""


@dataclass
class AndOr:
    first: Pipeline
    rest: list                       # [(op, Pipeline)]


@dataclass
class ListNode:
    items: list                      # [(AndOr, background: bool)]
    raw: str = ""


@dataclass
class If:
    clauses: list                    # [(cond ListNode, body ListNode, origin)]
    else_body: ListNode | None
    origin: Origin


@dataclass
class For:
    var: str
    words: list | None               # None: "$@"
    body: ListNode
    origin: Origin


@dataclass
class ArithFor:
    init: Word
    cond: Word
    step: Word
    body: ListNode
    origin: Origin


@dataclass
class While:
    cond: ListNode
    body: ListNode
    until: bool
    origin: Origin


@dataclass
class Case:
    word: Word
    items: list                      # [(patterns [Word], body ListNode, terminator)]
    origin: Origin


@dataclass
class Group:
    body: ListNode
    subshell: bool
    origin: Origin
    redirects: list = field(default_factory=list)


@dataclass
class FuncDef:
    name: str
    body: object
    origin: Origin


@dataclass
class CondCmd:
    tokens: list                     # Word or operator str
    origin: Origin


@dataclass
class ArithCmd:
    expr: Word
    origin: Origin

