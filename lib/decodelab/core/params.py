"""What every notebook's parameters cell holds, validated in one place.

Each phase's ``notebook.NotebookParams`` subclasses :class:`NotebookParams`, adds its own fields
and checks them in :meth:`NotebookParams.check`. Every field whose default is a bool must be a
bool. ``NOTEBOOK`` names the notebook in error messages (``02_replay.p_stop=2: ...``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from decodelab.core.profiles import PROFILES
from decodelab.core.validate import check_choice


@dataclass(frozen=True, slots=True)
class NotebookParams:
    NOTEBOOK: ClassVar[str] = "notebook"

    profile: str = "cpu"
    interactive: bool = True  # sliders and widgets (off under papermill: static figures)

    def __post_init__(self) -> None:
        check_choice(self.NOTEBOOK, "profile", self.profile, PROFILES)
        for field in dataclasses.fields(self):
            if isinstance(field.default, bool):
                check_choice(self.NOTEBOOK, field.name, getattr(self, field.name), (True, False))
        self.check()

    def check(self) -> None:
        """The phase's own checks (none here)."""
