"""The GPU machine's Python as data: what its image holds, what travels to it as wheels, and a guard.

The H200 machine this project borrows has no network: its Python (3.12) holds the packages listed
in `h200_packages.txt` and nothing else, so whatever trtspec's GPU check imports must be there or
be carried as wheels (`wheels.txt`, downloaded by scripts/gpu_wheels.sh). Two checks prove that
before any GPU time is spent:

- `check_wheels(folder)`: every downloaded wheel is one the list pins, fits cp312 manylinux
  x86_64, and each of its requirements is carried or on the image (`--no-deps` fetches none);
- `install_guard()`: an import hook (`sys.meta_path` finder) that makes this interpreter refuse,
  like the image would, any top-level module trtspec's code (or a carried package) imports that is
  neither standard library (of Python 3.12) nor provided by an image or carried distribution.
  Imports made by other third-party packages are theirs: the image's copies of those packages
  bring what they need there, and the versions here differ. A refused import raises
  ModuleNotFoundError, so an import guarded by `except ImportError` behaves as on the image and an
  unguarded one fails the run. A module another package imported first is not checked again
  (Python finds it in `sys.modules`), so the guard proves what trtspec needs, not what it may reuse.
"""

from __future__ import annotations

import importlib.abc
import importlib.metadata
import sys
import zipfile
from collections.abc import Iterable
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

HERE = Path(__file__).parent
IMAGE_PACKAGES = HERE / "h200_packages.txt"
CARRIED_WHEELS = HERE / "wheels.txt"
FIRST_PARTY = ("trtspec", "plugins", "__main__")
# Modules Python 3.12 no longer has (PEP 594 and PEP 632), refused even when this Python is older.
REMOVED_IN_312 = frozenset({"asynchat", "asyncore", "distutils", "imp", "smtpd"})
IMAGE_PYTHON = "3.12"
MAX_WHEEL_BYTES = 48 << 20  # the device tool carries 64 MiB in all, the repository included


def read_pins(path: Path) -> dict[str, str | None]:
    """NAME or NAME==VERSION per line (# comments) -> {canonical name: version or None}."""
    pins: dict[str, str | None] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        if not name.strip() or (_ and not version.strip()):
            raise ValueError(f"{path}:{number}: expected NAME or NAME==VERSION, got {raw!r}")
        pins[canonicalize_name(name.strip())] = version.strip() or None
    return pins


def stdlib_modules() -> frozenset[str]:
    return frozenset(sys.stdlib_module_names) - REMOVED_IN_312


class ImageOnlyFinder(importlib.abc.MetaPathFinder):
    """Refuses, for first-party and carried code, top-level imports the GPU image could not satisfy."""

    def __init__(self, allowed: Iterable[str], carried: Iterable[str],
                 first_party: Iterable[str] = FIRST_PARTY, log_path: Path | None = None):
        self.allowed = {canonicalize_name(n) for n in allowed}
        self.carried = {canonicalize_name(n) for n in carried}
        self.first_party = frozenset(first_party)
        self.stdlib = stdlib_modules()
        self.log_path = log_path
        self.refused: list[tuple[str, str]] = []  # (module, importer)
        self._module_dists: dict[str, list[str]] = {}
        self._checked: frozenset[str] = frozenset()

    def _load(self) -> None:
        """Map modules to distributions on first use (it reads every installed distribution)."""
        if not self._module_dists:
            self._module_dists = importlib.metadata.packages_distributions()
            carried_modules = {m for m, dists in self._module_dists.items()
                               if any(canonicalize_name(d) in self.carried for d in dists)}
            self._checked = self.first_party | carried_modules

    @staticmethod
    def _importer() -> str:
        """Top-level name of the module whose code is importing (import machinery skipped)."""
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_globals.get("__name__", "")
            if not (name.startswith(("importlib", "_frozen_importlib")) or name == __name__):
                return name.split(".")[0]
            frame = frame.f_back
        return ""

    def find_spec(self, fullname, path=None, target=None):
        if "." in fullname or fullname in self.stdlib or fullname in self.first_party:
            return None
        self._load()
        importer = self._importer()
        if importer not in self._checked:
            return None
        if any(canonicalize_name(d) in self.allowed for d in self._module_dists.get(fullname, [])):
            return None
        self.refused.append((fullname, importer))
        if self.log_path is not None:
            with self.log_path.open("a") as log:
                log.write(f"{fullname} {importer}\n")
        raise ModuleNotFoundError(
            f"No module named {fullname!r} on the GPU image: imported by {importer}, but neither "
            f"{IMAGE_PACKAGES.name} nor {CARRIED_WHEELS.name} provides it (trtspec.gpu.image guard)",
            name=fullname)


def install_guard(packages: Path = IMAGE_PACKAGES, wheels: Path = CARRIED_WHEELS,
                  first_party: Iterable[str] = FIRST_PARTY, log_path: Path | None = None) -> ImageOnlyFinder:
    """Put the image-only finder first on `sys.meta_path` of this interpreter; return it."""
    carried = read_pins(wheels)
    finder = ImageOnlyFinder(set(read_pins(packages)) | set(carried), carried, first_party, log_path)
    sys.meta_path.insert(0, finder)
    return finder


# -- the wheels that travel ---------------------------------------------------------------------

def image_environment() -> dict[str, str]:
    """Marker environment of the image's interpreter (CPython 3.12 on Linux x86_64)."""
    env = default_environment()
    env.update(python_version=IMAGE_PYTHON, python_full_version=f"{IMAGE_PYTHON}.3", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython", extra="")
    return env


def _fits_image(tags) -> bool:
    return any(t.interpreter in ("py3", "cp312") and (t.platform == "any" or
               (t.platform.startswith("manylinux") and t.platform.endswith("_x86_64"))) for t in tags)


def _requirements(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        metadata = next((n for n in z.namelist() if n.endswith(".dist-info/METADATA")), None)
        if metadata is None:
            raise ValueError(f"{wheel.name}: no .dist-info/METADATA inside")
        text = z.read(metadata).decode()
    header = text.split("\n\n", 1)[0]
    return [Requirement(line.split(":", 1)[1].strip()) for line in header.splitlines()
            if line.startswith("Requires-Dist:")]


def check_wheels(folder: Path, packages: Path = IMAGE_PACKAGES, wheels: Path = CARRIED_WHEELS) -> list[str]:
    """Problems with the wheels in `folder` (empty when they install on the image with no network)."""
    image, carried = read_pins(packages), read_pins(wheels)
    found: dict[str, tuple[Version, Path]] = {}
    problems = []
    files = sorted(folder.glob("*.whl"))
    for wheel in files:
        name, version, _, tags = parse_wheel_filename(wheel.name)
        if name in found:
            problems.append(f"two wheels of {name}: {found[name][1].name} and {wheel.name} "
                            "(pip refuses both)")
        found[name] = (version, wheel)
        if not _fits_image(tags):
            problems.append(f"{wheel.name}: not for CPython {IMAGE_PYTHON} manylinux x86_64")
    for name, pinned in carried.items():
        if name not in found:
            problems.append(f"{name}=={pinned} is listed in {wheels.name} but has no wheel in {folder}")
        elif pinned and found[name][0] != Version(pinned):
            problems.append(f"{found[name][1].name}: {wheels.name} pins {name}=={pinned}")
    env = image_environment()
    for name, (_, wheel) in found.items():
        if name not in carried:
            problems.append(f"{wheel.name}: not listed in {wheels.name}")
        for req in _requirements(wheel):
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = canonicalize_name(req.name)
            if dep in found:
                have = found[dep][0]
            elif dep in image:
                have = Version(image[dep]) if image[dep] else None
            else:
                problems.append(f"{wheel.name} requires {req}, which is neither carried nor on the image")
                continue
            if have is not None and req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{wheel.name} requires {req}, but {dep} {have} is what the image would get")
    total = sum(f.stat().st_size for f in files)
    if total > MAX_WHEEL_BYTES:
        problems.append(f"{folder} holds {total / 2**20:.1f} MiB of wheels; keep it under "
                        f"{MAX_WHEEL_BYTES / 2**20:.0f} MiB (the device tool carries 64 MiB in all)")
    return problems


def main(argv: list[str] | None = None) -> int:
    """`python -m trtspec.gpu.image check-wheels DIR`: exit 1 listing each problem."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "check-wheels":
        print("usage: python -m trtspec.gpu.image check-wheels DIR", file=sys.stderr)
        return 2
    folder = Path(args[1])
    if not folder.is_dir():
        print(f"error: {folder} is not a folder (run scripts/gpu_wheels.sh first)", file=sys.stderr)
        return 2
    problems = check_wheels(folder)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        count = len(list(folder.glob("*.whl")))
        size = sum(f.stat().st_size for f in folder.glob("*.whl")) / 2**20
        print(f"{count} wheels in {folder} ({size:.1f} MiB): each requirement is carried or on the image")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
