"""Shell arithmetic: ``$(( ))``, ``(( ))``, ``let``, ``declare -i`` values and array indices,
evaluated over integers as bash does; a name reads a variable through the interpreter."""

from __future__ import annotations

import re
from megatron_estimator.inputs.bash.values import Cause, Origin


class ArithUnknown(Exception):
    def __init__(self, cause: Cause):
        self.cause = cause


class ArithError(Exception):
    pass


_ARITH_TOKEN = re.compile(
    r"\s*(?:(?P<num>0[xX][0-9A-Fa-f]+|\d+#[0-9A-Za-z@_]+|\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>\*\*=|<<=|>>=|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||\+\+|--|\+=|-=|\*=|/=|%=|&=|\^=|\|=|[-+*/%<>=!~&^|?:(),\[\]]))"
)

_BINARY = {
    ",": 1, "=": 2, "+=": 2, "-=": 2, "*=": 2, "/=": 2, "%=": 2, "<<=": 2, ">>=": 2, "&=": 2, "^=": 2, "|=": 2,
    "**=": 2, "?": 3, "||": 4, "&&": 5, "|": 6, "^": 7, "&": 8, "==": 9, "!=": 9, "<": 10, "<=": 10, ">": 10,
    ">=": 10, "<<": 11, ">>": 11, "+": 12, "-": 12, "*": 13, "/": 13, "%": 13, "**": 14,
}
_RIGHT_ASSOC = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "&=", "^=", "|=", "**=", "?", "**"}


class Arithmetic:
    """Evaluates a bash arithmetic expression over integers; names are variables.

    ``interp`` reads and sets them: ``arith_variable``, ``arith_element``, ``arith_assign``."""

    def __init__(self, interp, text: str, origin: Origin, depth: int = 0):
        self.interp = interp
        self.origin = origin
        self.depth = depth
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _ARITH_TOKEN.match(text, pos)
            if not m or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                raise ArithError(f"cannot read {text[pos:]!r} in arithmetic")
            kind = m.lastgroup
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.k = 0

    def run(self) -> int:
        if not self.tokens:
            return 0
        value = self.expr(0)
        if self.k != len(self.tokens):
            raise ArithError(f"unexpected {self.tokens[self.k][1]!r} in arithmetic")
        return self.get(value)

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.k] if self.k < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ArithError("arithmetic expression ends too early")
        self.k += 1
        return token

    # values are ints or ('name', NAME) lvalues
    def get(self, value) -> int:
        if isinstance(value, tuple):
            return self.interp.arith_variable(value[1], self.origin, self.depth)
        return value

    def expr(self, min_prec: int):
        left = self.unary()
        while True:
            token = self.peek()
            if token is None or token[0] != "op" or token[1] not in _BINARY:
                return left
            op = token[1]
            prec = _BINARY[op]
            if prec < min_prec:
                return left
            self.k += 1
            if op == "?":
                then = self.expr(0)
                if self.take()[1] != ":":
                    raise ArithError("`?` without `:` in arithmetic")
                other = self.expr(prec)
                left = self.get(then) if self.get(left) else self.get(other)
                continue
            right = self.expr(prec if op in _RIGHT_ASSOC else prec + 1)
            if prec == 2:
                if not isinstance(left, tuple):
                    raise ArithError(f"{op} needs a variable on its left")
                value = self.get(right) if op == "=" else self.apply(op[:-1], self.get(left), self.get(right))
                self.interp.arith_assign(left[1], value, self.origin)
                left = value
                continue
            if op == ",":
                self.get(left)
                left = right
                continue
            left = self.apply(op, self.get(left), self.get(right))

    def apply(self, op: str, a: int, b: int) -> int:
        if op in ("/", "%") and b == 0:
            raise ArithError("division by zero in arithmetic")
        if op == "/":
            q = abs(a) // abs(b)
            return q if (a >= 0) == (b >= 0) else -q
        if op == "%":
            return a - b * self.apply("/", a, b)
        if op == "**":
            if b < 0:
                raise ArithError("negative exponent in arithmetic")
            return a ** b
        ops = {
            "+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "<<": lambda: a << b, ">>": lambda: a >> b,
            "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b), ">=": lambda: int(a >= b),
            "==": lambda: int(a == b), "!=": lambda: int(a != b), "&": lambda: a & b, "^": lambda: a ^ b,
            "|": lambda: a | b, "&&": lambda: int(bool(a) and bool(b)), "||": lambda: int(bool(a) or bool(b)),
        }
        return ops[op]()

    def unary(self):
        kind, text = self.take()
        if kind == "num":
            return self.number(text)
        if kind == "name":
            token = self.peek()
            if token and token[1] == "[":
                self.k += 1
                index = self.get(self.expr(0))
                if self.take()[1] != "]":
                    raise ArithError("`[` without `]` in arithmetic")
                return self.interp.arith_element(text, index, self.origin)
            if token and token[1] in ("++", "--"):
                self.k += 1
                old = self.get(("name", text))
                self.interp.arith_assign(text, old + (1 if token[1] == "++" else -1), self.origin)
                return old
            return ("name", text)
        if text == "(":
            value = self.get(self.expr(0))
            if self.take()[1] != ")":
                raise ArithError("`(` without `)` in arithmetic")
            return value
        if text in ("++", "--"):
            kind2, name = self.take()
            if kind2 != "name":
                raise ArithError(f"{text} needs a variable")
            value = self.get(("name", name)) + (1 if text == "++" else -1)
            self.interp.arith_assign(name, value, self.origin)
            return value
        if text == "-":
            return -self.get(self.unary())
        if text == "+":
            return self.get(self.unary())
        if text == "!":
            return int(not self.get(self.unary()))
        if text == "~":
            return ~self.get(self.unary())
        raise ArithError(f"unexpected {text!r} in arithmetic")

    @staticmethod
    def number(text: str) -> int:
        if "#" in text:
            base, digits = text.split("#", 1)
            return int(digits, int(base))
        if text.lower().startswith("0x"):
            return int(text, 16)
        if len(text) > 1 and text.startswith("0"):
            return int(text, 8)
        return int(text)

