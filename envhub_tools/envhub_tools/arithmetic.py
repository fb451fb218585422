"""A safe arithmetic evaluator (no ``eval``): integers, ``+ - * /``, unary minus and parentheses.

The expression is parsed with :func:`ast.parse` and only the node types of that grammar are
walked; everything else (names, calls, attributes, powers, floats, strings) is refused with the
reason. Division is exact (:class:`fractions.Fraction`), and the size of every intermediate value
is capped, so no input costs more than its length.
"""

from __future__ import annotations

import ast
from fractions import Fraction

#: The longest expression accepted, in characters.
MAX_LENGTH = 200
#: The largest magnitude of any value, intermediate ones included.
MAX_MAGNITUDE = 10**12

_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class ExpressionError(ValueError):
    """An expression that is not plain arithmetic, or whose value is undefined or too large."""


def _evaluate(node: ast.AST, numbers: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, numbers)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int):
            raise ExpressionError(f"only whole numbers are allowed, not {node.value!r}")
        numbers.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, numbers)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left, numbers), _evaluate(node.right, numbers)
        if isinstance(node.op, ast.Add):
            value = left + right
        elif isinstance(node.op, ast.Sub):
            value = left - right
        elif isinstance(node.op, ast.Mult):
            value = left * right
        else:
            if right == 0:
                raise ExpressionError("division by zero")
            value = left / right
        if abs(value) > MAX_MAGNITUDE or value.denominator > MAX_MAGNITUDE:
            raise ExpressionError(f"a value exceeds {MAX_MAGNITUDE:.0e} in magnitude")
        return value
    if isinstance(node, ast.BinOp):
        raise ExpressionError("only + - * / are allowed")
    raise ExpressionError(f"only numbers, + - * / and parentheses are allowed, not {type(node).__name__.lower()}")


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """The exact value of ``expression`` and the numbers it uses, in order of appearance.

    Raises:
        ExpressionError: with a one-line reason for anything but plain arithmetic, a division by
            zero, or a value too large.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ExpressionError("the expression is empty")
    if len(expression) > MAX_LENGTH:
        raise ExpressionError(f"the expression is {len(expression)} characters long; at most {MAX_LENGTH} are allowed")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        detail = exc.msg if isinstance(exc, SyntaxError) else type(exc).__name__
        raise ExpressionError(f"cannot read the expression: {detail}") from None
    numbers: list[int] = []
    try:
        return _evaluate(tree, numbers), numbers
    except RecursionError:
        raise ExpressionError("the expression is nested too deeply") from None


def format_value(value: Fraction) -> str:
    """``27``, or ``7/2`` for a value that is not whole."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
