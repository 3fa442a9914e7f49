"""Predict, then run: a question asked before the cell that reveals its answer.

A :class:`Question` is either multiple choice (``choices``, ``answer`` one of them) or numeric (``answer`` a
number, accepted within ``rel_tol``). Its answer is computed by the course's own functions or a closed form, or,
for a published figure, carries its ``source`` link; never typed in. A notebook asks by name,
``quiz.ask("ring-bytes")``: the prompt, answer and explanation live in :mod:`course.quiz_answers`, out of the
learner's sight, and :func:`named` builds the question from there. ``reveal`` (the name) also names the later
code cell that shows the answer: that cell carries the line ``# reveals: <reveal>`` (``tests/test_quiz.py``
checks every notebook asks at least two questions, each before its reveal, and that no notebook's source holds
an answer).

:func:`grade` is pure (testable without a browser): it turns a response into :class:`Feedback`, whose text
gives the answer and the explanation only once the student has answered. :func:`ask` shows the question as a
widget (choices or a text box, a "Check" button, the feedback under them); without ipywidgets it prints the
question and how to answer it with :meth:`Question.check`. Displaying never blocks, so a notebook runs top to
bottom unattended (nbval). Every notebook asks its questions with it.
"""

from __future__ import annotations

import html
import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

REVEAL_MARK = "# reveals:"


@dataclass(frozen=True, repr=False)
class Question:
    """One predict-then-run question.

    Args:
        prompt: the question, in the notebook's terms.
        answer: the right choice (a string in ``choices``) or the number, computed, never typed in.
        explanation: why, shown only after the student answered.
        reveal: a short name; the code cell that reveals the answer has the line ``# reveals: <reveal>``.
        choices: the options of a multiple-choice question; empty for a numeric one.
        rel_tol: numeric questions: a response within this fraction of ``answer`` counts as right.
        unit: numeric questions: the unit the number is in (``"bytes"``, ``"steps"``), said with the answer.
        source: a link to the publication, when the answer is a published figure.

    Raises:
        ValueError: a multiple-choice answer that is not one of the choices, a numeric answer that is not a
            finite number, or a negative tolerance.
    """

    prompt: str
    answer: str | float
    explanation: str
    reveal: str
    choices: tuple[str, ...] = ()
    rel_tol: float = 0.05
    unit: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[\w-]+", self.reveal):
            raise ValueError(f"reveal should be a short name of letters, digits, - or _, got {self.reveal!r}")
        if self.choices:
            object.__setattr__(self, "choices", tuple(self.choices))
            if self.answer not in self.choices:
                raise ValueError(f"answer should be one of the choices {self.choices}, got {self.answer!r}")
        elif isinstance(self.answer, bool) or not isinstance(self.answer, numbers.Real) or not math.isfinite(
                self.answer):
            raise ValueError(f"a numeric question needs a finite number as its answer, got {self.answer!r}; "
                             f"for a multiple-choice question pass choices=(...)")
        if self.rel_tol < 0:
            raise ValueError(f"rel_tol should be >= 0, got {self.rel_tol}")

    def __repr__(self) -> str:  # the answer stays hidden until the student answers
        return f"Question(reveal={self.reveal!r}, prompt={self.prompt!r})"

    @property
    def numeric(self) -> bool:
        """True for a numeric question, False for a multiple-choice one."""
        return not self.choices

    def check(self, response: Any) -> Feedback:
        """Grade ``response`` and print the feedback (for use without widgets)."""
        feedback = grade(self, response)
        print(feedback.text)
        return feedback


@dataclass(frozen=True)
class Feedback:
    """The verdict on one response: ``correct`` is None when the response could not be read."""

    correct: bool | None
    text: str

    @property
    def answered(self) -> bool:
        """True once the response was a real answer, i.e. the explanation may be shown."""
        return self.correct is not None


def parse_number(text: Any) -> float:
    """A number from what a student typed: ``1.5e6``, ``1,500,000``, ``25%`` (0.25) or ``3/4``.

    Raises:
        ValueError: naming what was typed and the forms accepted.
    """
    if isinstance(text, bool):
        raise ValueError(f"expected a number, got {text!r}")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        cleaned = str(text).strip().replace(",", "").replace("_", "").replace(" ", "")
        scale = 0.01 if cleaned.endswith("%") else 1.0
        cleaned = cleaned.removesuffix("%")
        try:
            if "/" in cleaned:
                top, bottom = cleaned.split("/")
                value = float(top) / float(bottom) * scale
            else:
                value = float(cleaned) * scale
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"expected a number, got {str(text)!r}: type digits such as 1536, 1.5e6, 0.25, "
                             f"25% or 3/4") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def format_answer(question: Question) -> str:
    """The answer as a student reads it: the choice, or the number (with its unit)."""
    if not question.numeric:
        return str(question.answer)
    value = float(question.answer)
    if value == round(value) and abs(value) < 1e12:
        number = f"{int(round(value)):,}"
    else:
        number = f"{value:.4g}"
    return f"{number} {question.unit}".strip()


def grade(question: Question, response: Any) -> Feedback:
    """Grade one response; the feedback gives the answer and explanation only for a readable response."""
    if question.numeric:
        try:
            value = parse_number(response)
        except ValueError as error:
            return Feedback(None, f"Not an answer yet: {error}.")
        answer = float(question.answer)
        correct = abs(value - answer) <= question.rel_tol * abs(answer)  # relative to the answer, not the guess
        said = f"{value:.4g}"
    else:
        if response not in question.choices:
            return Feedback(None, f"Not an answer yet: pick one of {list(question.choices)}, got {response!r}.")
        correct = response == question.answer
        said = str(response)
    verdict = "Right" if correct else f"Not quite: you said {said}"
    tolerance = f" (within {question.rel_tol:.0%})" if question.numeric and question.rel_tol else ""
    source = f" Source: {question.source}" if question.source else ""
    return Feedback(correct, f"{verdict}. The answer is {format_answer(question)}{tolerance}. "
                             f"{question.explanation}{source}")


def widget(question: Question) -> Any:
    """The question as an ipywidgets box: prompt, choices or a text box, a Check button, then the feedback.

    The feedback (an ``HTML`` widget, the box's last child) stays empty until Check is pressed on a readable
    response. Raises ImportError when ipywidgets is missing.
    """
    import ipywidgets as widgets

    prompt = widgets.HTML(f"<b>Predict, then run.</b> {html.escape(question.prompt)}")
    if question.numeric:
        entry = widgets.Text(placeholder=f"your prediction{f' ({question.unit})' if question.unit else ''}")
    else:
        entry = widgets.RadioButtons(options=list(question.choices), value=None,
                                     layout=widgets.Layout(width="auto"))
    button = widgets.Button(description="Check")
    feedback = widgets.HTML("")

    def on_check(_: Any) -> None:
        result = grade(question, entry.value)
        colour = {True: "green", False: "firebrick", None: "darkorange"}[result.correct]
        feedback.value = f'<span style="color:{colour}">{html.escape(result.text)}</span>'

    button.on_click(on_check)
    return widgets.VBox([prompt, entry, button, feedback])


def named(name: str, **context: Any) -> Question:
    """The question called ``name``, built from :mod:`course.quiz_answers` with the numbers in ``context``.

    Raises:
        KeyError: no question has that name. TypeError: ``context`` does not fit the question.
    """
    from course import quiz_answers  # the answers load only when a question is asked

    return Question(reveal=name, **quiz_answers.fields(name, **context))


def ask(question: Question | str, **context: Any) -> None:
    """Show the question (a widget in Jupyter, text elsewhere); never waits for an answer.

    Args:
        question: a :class:`Question`, or the name of one in :mod:`course.quiz_answers` (what notebooks pass,
            so that the answer stays out of the notebook's source).
        context: for a name, the numbers the question is built from (``quiz.ask("server-bytes", workers=3)``).
    """
    if isinstance(question, str):
        question = named(question, **context)
    elif context:
        raise TypeError(f"context is for a question given by name, got a Question and {sorted(context)}")
    try:
        box = widget(question)
    except ImportError:
        options = "".join(f"\n  - {choice}" for choice in question.choices)
        print(f"Predict, then run: {question.prompt}{options}\n(ipywidgets is not installed: write your "
              f"prediction down, or grade it with quiz.named({question.reveal!r}).check(your_answer), then run "
              f"the next cells)")
        return
    from IPython.display import display

    display(box)
