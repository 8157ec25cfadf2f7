"""environment.yml's pip section mirrors the pyproject's dependencies."""

import re
import tomllib

from decodelab.core import paths


def test_environment_yml_mirrors_pyproject():
    root = paths.repo_root()
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    wanted = set(project["dependencies"])
    for extra in ("notebooks", "reference", "dev"):
        wanted |= set(project["optional-dependencies"][extra])
    listed = set(re.findall(r'^\s+- "([^"]+)"$', (root / "environment.yml").read_text(), re.M))
    listed.discard("-e .[notebooks,reference,dev]")
    assert wanted == listed
