# decodelab on Colab / Kaggle: paste this as the first cell of a notebook and run it.
# It clones the repository once, installs it with what its notebooks need, and makes
# `import decodelab` work in this kernel at once (no restart). Running it again is safe: it
# reuses the clone and the install.
REPO_URL = "https://github.com/OWNER/decodelab.git"  # OWNER: whoever hosts your copy

import importlib
import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

CHECKOUT = Path.home() / "decodelab"  # absolute: re-runs work whatever the current folder is
if not (CHECKOUT / "pyproject.toml").is_file():
    if "/OWNER/" in REPO_URL:
        raise ValueError("set REPO_URL (top of this cell) to the URL of a decodelab repository")
    subprocess.run(["git", "clone", "--depth", "1", REPO_URL, str(CHECKOUT)], check=True)
# The package and its `notebooks` extra (papermill, nbformat, nbconvert, jupytext: what
# `python -m decodelab run` and `report` need), less the runtime's own Jupyter: its frontend,
# kernel and widgets stay as Colab / Kaggle installed them.
RUNTIME_OWN = {"jupyterlab", "ipykernel", "ipywidgets"}
project = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]
needed = [r for r in project["optional-dependencies"]["notebooks"]
          if re.match(r"[\w.-]+", r)[0].lower() not in RUNTIME_OWN]


def installed(requirement):
    try:
        return bool(metadata.version(re.match(r"[\w.-]+", requirement)[0]))
    except metadata.PackageNotFoundError:
        return False


if not all(installed(r) for r in ["decodelab", *needed]):  # else an earlier run installed them
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "-e", str(CHECKOUT),
                    *needed], check=True)
# pip's editable install takes effect in new interpreters only (its .pth file is read at
# start-up); putting lib/ on the path makes it importable in this one.
if str(CHECKOUT / "lib") not in sys.path:
    sys.path.insert(0, str(CHECKOUT / "lib"))
importlib.invalidate_caches()
os.chdir(CHECKOUT / "notebooks")

import torch

import decodelab

print(f"decodelab from {Path(decodelab.__file__).parent}; torch {torch.__version__}")
print(torch.cuda.get_device_name(0) if torch.cuda.is_available()
      else "no GPU: CPU measurements + the shipped reference results")
