"""Whether the installed torch and torchvision are a matching pair, read from their installed metadata without
importing either (a mismatched torchvision fails on import with an operator error that names neither version).

    python -m atlas_fast.app.torch_pair

prints the pair and exits 0 when it matches, else one ``error:`` line with both versions and the command that fixes
it (status 2); the command line makes the same check before a command runs. A mismatch happens when PyTorch's CPU
index is unreachable and pip takes one of the two from the default index.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version

# torchvision 0.N pairs with torch 2.(N - 15) (0.15 <-> 2.0, ..., 0.29 <-> 2.14): PyTorch releases them together.
TORCHVISION_MINOR_OFFSET = 15
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class InstallError(ValueError):
    """torch and torchvision are installed at versions that do not work together."""


def _major_minor(text: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def pair_problem(torch_version: str, torchvision_version: str) -> str | None:
    """What is wrong with this pair of versions (None when they match, or when torch is not 2.x, whose pairing this
    rule does not cover), with the ``pip`` command that installs the torchvision of this torch."""
    torch_release, vision_release = _major_minor(torch_version), _major_minor(torchvision_version)
    if torch_release is None or vision_release is None or torch_release[0] != 2:
        return None
    wanted = torch_release[1] + TORCHVISION_MINOR_OFFSET
    if vision_release == (0, wanted):
        return None
    index = f" --index-url {CPU_INDEX}" if "+cpu" in torch_version else ""
    return (f"torch {torch_version} and torchvision {torchvision_version} do not match (torch 2.{torch_release[1]} "
            f"needs torchvision 0.{wanted}); install the matching one: pip install \"torchvision==0.{wanted}.*\""
            f"{index}")


def installed_pair() -> tuple[str, str] | None:
    """(torch version, torchvision version) as installed, or None when either is missing."""
    try:
        return version("torch"), version("torchvision")
    except PackageNotFoundError:
        return None


def check_torch_pair() -> None:
    """Refuse a mismatched torch / torchvision install (:class:`InstallError`, one line naming both versions)."""
    pair = installed_pair()
    problem = pair_problem(*pair) if pair else None
    if problem:
        raise InstallError(problem)


def main() -> int:
    pair = installed_pair()
    if pair is None:
        print("error: torch or torchvision is not installed", file=sys.stderr)
        return 2
    problem = pair_problem(*pair)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"torch {pair[0]} and torchvision {pair[1]} match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
