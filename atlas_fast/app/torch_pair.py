"""Whether the installed torch and torchvision are a matching pair, read from their installed metadata and files
without importing either (a mismatched torchvision fails on import with an operator error that names neither
version): their version numbers, their builds (a CPU torch beside PyPI's CUDA torchvision has matching numbers), and
the libraries torchvision's compiled operators need, read from its ``_C`` file, against those torch has. The command
line makes this check before a command runs. ``python -m atlas_fast.app.torch_pair`` also imports both and looks
``torchvision::nms`` up, prints the pair and exits 0 when it matches, else one ``error:`` line with both versions
and the command that fixes it (status 2). A mismatch happens when PyTorch's CPU index is unreachable and pip takes
one of the two from the default index.
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


def build_problem(torch_version: str, torchvision_version: str, platform: str = sys.platform) -> str | None:
    """A CPU build of torch beside a CUDA build of torchvision (or the reverse), read from their local version tags
    (``2.13.0+cpu`` against PyPI's ``0.28.0``, which on Linux is built for CUDA): their numbers match, but
    torchvision's operators (``torchvision::nms``) cannot load, and ``import torchvision`` fails."""
    torch_tag, vision_tag = torch_version.partition("+")[2], torchvision_version.partition("+")[2]
    if not platform.startswith("linux") or torch_tag == vision_tag:
        return None
    builds = {"cpu": "a CPU build", "": "PyPI's (CUDA) build on Linux"}

    def build(tag: str) -> str:
        return builds.get(tag, f"a {tag} build")

    if "cpu" not in (torch_tag, vision_tag) and "" in (torch_tag, vision_tag):
        return None  # PyPI's default build and a CUDA index's: both CUDA (the CUDA versions are torch's to check)
    wanted = _major_minor(torchvision_version)
    index = f" --index-url {CPU_INDEX}" if torch_tag == "cpu" else ""
    return (f"torch {torch_version} is {build(torch_tag)} and torchvision {torchvision_version} {build(vision_tag)}: "
            f"torchvision's operators (torchvision::nms) cannot load into this torch; install the torchvision of "
            f"torch's build: pip install --force-reinstall \"torchvision=={wanted[0]}.{wanted[1]}.*\"{index}"
            if wanted else None)


def needed_libraries(path: str) -> list[str]:
    """The shared libraries an ELF file needs (its DT_NEEDED entries), read from the file without loading it; empty
    for a file that is not a 64-bit little-endian ELF."""
    import struct

    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return []
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    loads, dynamic = [], None
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz, _, _ = struct.unpack_from("<IIQQQQQQ", data, phoff + i * phentsize)
        if kind == 1:
            loads.append((vaddr, offset, filesz))
        elif kind == 2:
            dynamic = (offset, filesz)
    if dynamic is None:
        return []
    entries = [struct.unpack_from("<qQ", data, dynamic[0] + i) for i in range(0, dynamic[1], 16)]
    strtab = next((value for tag, value in entries if tag == 5), None)
    start = next((offset + strtab - vaddr for vaddr, offset, size in loads if vaddr <= (strtab or -1) < vaddr + size),
                 None)
    if start is None:
        return []
    return [data[start + value:data.index(b"\0", start + value)].decode() for tag, value in entries if tag == 1]


def library_problem(torch_version: str, torchvision_version: str, torch_dir: str | None = None,
                    vision_dir: str | None = None) -> str | None:
    """torchvision's compiled operators need a library of torch's that this torch lacks (a CUDA torchvision beside a
    CPU torch): found from the files of the installed packages (or of the package folders given), importing
    neither."""
    import glob
    import importlib.util
    import os

    if torch_dir is None or vision_dir is None:
        vision, torch_spec = importlib.util.find_spec("torchvision"), importlib.util.find_spec("torch")
        if vision is None or torch_spec is None or vision.origin is None or torch_spec.origin is None:
            return None
        torch_dir, vision_dir = os.path.dirname(torch_spec.origin), os.path.dirname(vision.origin)
    torch_lib = os.path.join(torch_dir, "lib")
    for library in sorted(glob.glob(os.path.join(vision_dir, "_C*.so"))):
        try:
            needed = needed_libraries(library)
        except (OSError, ValueError, IndexError, struct_error()):
            continue
        lacking = [n for n in needed if n.startswith(("libtorch", "libc10")) and not
                   os.path.exists(os.path.join(torch_lib, n))]
        if lacking:
            wanted = _major_minor(torchvision_version)
            index = f" --index-url {CPU_INDEX}" if "cuda" in " ".join(lacking) else ""
            return (f"torchvision {torchvision_version}'s operators ({os.path.basename(library)}, torchvision::nms) "
                    f"need {', '.join(lacking)}, which torch {torch_version} does not have: the two are builds for "
                    f"different devices; install the torchvision of torch's build: pip install --force-reinstall "
                    f"\"torchvision=={wanted[0]}.{wanted[1]}.*\"{index}" if wanted else None)
    return None


def struct_error() -> type[Exception]:
    import struct

    return struct.error


def installed_pair() -> tuple[str, str] | None:
    """(torch version, torchvision version) as installed, or None when either is missing."""
    try:
        return version("torch"), version("torchvision")
    except PackageNotFoundError:
        return None


def check_torch_pair() -> None:
    """Refuse a mismatched torch / torchvision install (:class:`InstallError`, one line naming both versions)."""
    pair = installed_pair()
    problem = (pair_problem(*pair) or build_problem(*pair) or library_problem(*pair)) if pair else None
    if problem:
        raise InstallError(problem)


def main() -> int:
    pair = installed_pair()
    if pair is None:
        print("error: torch or torchvision is not installed", file=sys.stderr)
        return 2
    problem = pair_problem(*pair) or build_problem(*pair) or library_problem(*pair) or operator_problem()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    print(f"torch {pair[0]} and torchvision {pair[1]} match (torchvision::nms loads)")
    return 0


def operator_problem() -> str | None:
    """What breaks when torchvision is imported and its ``nms`` operator looked up (this imports torch: the
    explicit check's last step, after the file checks that need no import)."""
    try:
        import torch
        import torchvision  # noqa: F401  (registers its operators)

        torch.ops.torchvision.nms  # noqa: B018  (raises where the operator did not load)
    except Exception as exc:  # an import of a mismatched build fails in many ways
        return f"torchvision's operators do not load ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    return None


if __name__ == "__main__":
    sys.exit(main())
