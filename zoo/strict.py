"""The one base of the zoo's typed data files (cards, recipes, run summaries): pydantic models that refuse unknown
fields, so a misspelt key is an error naming it instead of a silently ignored line."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OneOf:
    """A text field's check against the keys of a table (`Annotated[str, AfterValidator(OneOf(...))]`), read when a
    file is checked, so a row added to the table is accepted at once; the schema reference lists the keys."""

    def __init__(self, keys: Callable[[], Iterable[str]], what: str):
        self.keys, self.what = keys, what

    def __call__(self, value: str) -> str:
        if value not in (allowed := list(self.keys())):
            raise ValueError(f"unknown {self.what} '{value}'; choose one of: {', '.join(allowed)}")
        return value
