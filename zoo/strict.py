"""The one base of the zoo's typed data files (cards, recipes, run summaries): pydantic models that refuse unknown
fields, so a misspelt key is an error naming it instead of a silently ignored line."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
