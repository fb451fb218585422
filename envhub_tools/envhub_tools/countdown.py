"""``tools/Countdown-v0``: reach a target number from given numbers, with a calculator tool.

RAGEN and TinyZero play Countdown in one turn (the model writes the equation at once); here the
agent may try sub-expressions with ``calculate(expression)``, a safe evaluator
(:mod:`envhub_tools.arithmetic`), before it commits with ``submit(expression)``, which must use
every given number exactly once and equal the target. The puzzle is drawn from the seed by
combining the numbers at random, so every puzzle has a solution, which the expert checks with
one ``calculate`` call and then submits.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from envhub.core import ToolEnv, stable_key
from envhub.tools import ToolError, ToolResult, tool

from envhub_tools.arithmetic import MAX_LENGTH, ExpressionError, evaluate, format_value


def make_puzzle(rng: Any, count: int, max_number: int, max_target: int, attempts: int = 10_000) -> tuple[list[int], int, str]:
    """``(numbers, target, solution)``: ``count`` numbers in 1..``max_number`` and a target in
    10..``max_target`` that an expression using each number once reaches (every intermediate value
    a positive whole number)."""
    for _ in range(attempts):
        numbers = [int(n) for n in rng.integers(1, max_number + 1, size=count)]
        pool = [(n, str(n)) for n in numbers]
        while len(pool) > 1:
            i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
            (a, ea), (b, eb) = pool[i], pool[j]
            if a < b:
                (a, ea), (b, eb) = (b, eb), (a, ea)
            ea, eb = _operand(ea), _operand(eb)
            options = [(a + b, f"{ea} + {eb}"), (a * b, f"{ea} * {eb}")]
            if a > b:
                options.append((a - b, f"{ea} - {eb}"))
            if b > 1 and a % b == 0:
                options.append((a // b, f"{ea} / {eb}"))
            value, expression = options[int(rng.integers(len(options)))]
            pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(value, expression)]
        target, solution = pool[0]
        if 10 <= target <= max_target and target not in numbers:
            return numbers, target, solution
    raise RuntimeError(f"no Countdown puzzle with a target up to {max_target} in {attempts} attempts")


def _operand(expression: str) -> str:
    """``expression`` as an operand: a compound one in parentheses."""
    return expression if expression.isdigit() else f"({expression})"


class CountdownEnv(ToolEnv):
    """Countdown as a multi-turn tool task.

    Args:
        min_numbers: the fewest numbers a puzzle gives.
        max_numbers: the most (each episode draws the count uniformly between the two).
        max_number: the largest given number.
        max_target: the largest target.
        render_mode: ``"ansi"`` or None.
    """

    final_tools = ("submit",)
    max_argument_chars = MAX_LENGTH

    def __init__(self, min_numbers: int = 3, max_numbers: int = 4, max_number: int = 25, max_target: int = 250, render_mode: str | None = None):
        super().__init__(render_mode)
        if not 2 <= min_numbers <= max_numbers <= 6:
            raise ValueError(f"need 2 <= min_numbers <= max_numbers <= 6, got {min_numbers} and {max_numbers}")
        if max_number < 2 or max_target < 10:
            raise ValueError(f"max_number must be >= 2 and max_target >= 10, got {max_number} and {max_target}")
        self.min_numbers, self.max_numbers, self.max_number, self.max_target = min_numbers, max_numbers, max_number, max_target
        self.numbers: list[int] = []
        self.target = 0
        self.solution = ""
        self.calculated: set[str] = set()
        self.submitted: str | None = None
        self.correct = False
        self.instructions = (
            "Countdown: combine the given numbers with + - * / and parentheses to reach the target. "
            "Use every number exactly once; intermediate results may be fractions.\n"
            "Tools: calculate(expression) evaluates an arithmetic expression and tells you its value; "
            "submit(expression) ends the episode with your final expression, which must use each given number "
            "exactly once and equal the target. The reward is 1 for a correct submission."
        )

    # ------------------------------------------------------------------ tools

    @tool
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression with + - * / and parentheses.

        Args:
            expression: the expression, e.g. "(3 + 5) * 2".
        """
        try:
            value, _ = evaluate(expression)
        except ExpressionError as exc:
            raise ToolError(str(exc)) from None
        self.calculated.add("".join(expression.split()))
        return f"{expression.strip()} = {format_value(value)}"

    @tool
    def submit(self, expression: str) -> ToolResult:
        """Submit the final expression; this ends the episode.

        Args:
            expression: an expression that uses each given number exactly once and equals the target.
        """
        self.submitted = expression
        try:
            value, used = evaluate(expression)
        except ExpressionError as exc:
            return ToolResult(f"Your expression cannot be evaluated: {exc}. Not solved.", 0.0, True, {"submit_error": str(exc)})
        numbers_ok = Counter(used) == Counter(self.numbers)
        self.correct = numbers_ok and value == self.target
        if self.correct:
            verdict = f"{expression.strip()} = {self.target}: solved."
        elif not numbers_ok:
            verdict = f"{expression.strip()} uses {sorted(used)}, not each of {sorted(self.numbers)} exactly once. Not solved."
        else:
            verdict = f"{expression.strip()} = {format_value(value)}, not {self.target}. Not solved."
        return ToolResult(verdict, float(self.correct), True, {"value": format_value(value), "numbers_ok": numbers_ok})

    # ------------------------------------------------------------------ the env

    def _reset(self, options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        count = int(self.np_random.integers(self.min_numbers, self.max_numbers + 1))
        self.numbers, self.target, self.solution = make_puzzle(self.np_random, count, self.max_number, self.max_target)
        self.calculated = set()
        self.submitted = None
        self.correct = False
        return f"Numbers: {', '.join(map(str, self.numbers))}\nTarget: {self.target}", {}

    def state_key(self) -> str:
        calculated = stable_key("\n".join(sorted(self.calculated)), 12) if self.calculated else "-"
        done = "" if self.submitted is None else f"|submitted={int(self.correct)}"
        return f"{','.join(map(str, self.numbers))}->{self.target}|calc={calculated}{done}"

    def is_success(self) -> bool:
        return self.correct

    def render_text(self) -> str:
        lines = [f"Numbers: {', '.join(map(str, self.numbers))}", f"Target: {self.target}", f"Calculations: {len(self.calculated)}"]
        if self.submitted is not None:
            lines.append(f"Submitted: {self.submitted} ({'solved' if self.correct else 'not solved'})")
        return "\n".join(lines)

    def expert_action(self) -> str | None:
        """Check the known solution with the calculator, then submit it."""
        if self.submitted is not None or not self.numbers:
            return None
        if "".join(self.solution.split()) not in self.calculated:
            return self.call_action("calculate", expression=self.solution)
        return self.call_action("submit", expression=self.solution)
