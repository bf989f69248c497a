"""An example agent task: the model answers arithmetic through a calculator tool.

Each instance is one episode: the agent asks the model, runs the tool calls
the model makes through `llm.tool` (recorded, so `--resume` and replay never
run the calculator twice), and returns the model's final text to the scorer.
The rule-based model calls the tool for "What is A op B?" and cannot read
"to the power of", so one instance fails on purpose.
"""

from pytest_evalreplay import EvalTask, scorers
from pytest_evalreplay.agent import tool_message

CALCULATE = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Apply an arithmetic operator to two numbers.",
        "parameters": {
            "type": "object",
            "properties": {
                "a": {"type": "number"},
                "op": {"type": "string", "enum": ["+", "-", "*", "/"]},
                "b": {"type": "number"},
            },
            "required": ["a", "op", "b"],
        },
    },
}


def calculate(a: float, op: str, b: float) -> float:
    """The tool: a four-operation calculator."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b


def solve(instance, llm):
    """One episode: ask, run the tools the model calls, until it answers."""
    messages = [
        {"role": "system", "content": "Use the calculate tool for arithmetic."},
        {"role": "user", "content": instance["question"]},
    ]
    while True:
        turn = llm.chat(messages, tools=[CALCULATE])
        messages.append(turn.message)
        if not turn.tool_calls:
            return turn.text
        for call in turn.tool_calls:
            messages.append(tool_message(call, llm.tool(call, calculate)))


calculator = EvalTask(
    name="calculator",
    instances="data/calculator.jsonl",
    agent=solve,
    scorer=scorers.numeric_match(),
    target="answer",
    sampling={"temperature": 0.0, "max_tokens": 64},
    max_turns=4,
)
