"""The oldest Windows and macOS the installers may claim, stated from what is really bundled.

macOS: the app ships PySide6-Essentials and shiboken6 from their PyPI wheels, and Qt's
libraries in them are built for the macOS release that the wheel's platform tag names
(``pyside6_essentials-6.12.0-cp310-abi3-macosx_14_0_universal2.whl``: macOS 14). Claiming an
older macOS in the bundle's ``LSMinimumSystemVersion`` would let the app be installed where
it crashes at launch instead of Finder's clear "needs macOS 14" message. So:

* packaging/build.py (on macOS) runs this file in the build venv, which reads the wheel tags
  from the installed packages' ``*.dist-info/WHEEL`` files, compares them with the tags
  recorded below for the same versions (a build fails when they disagree), compiles
  llama-cpp-python and numpy with that ``MACOSX_DEPLOYMENT_TARGET`` (it fails if the
  environment sets another one), and passes it to the spec as ``IRIS_MACOS_MINIMUM``;
* packaging/iris-desktop.spec computes it again in the build venv, refuses a different
  ``IRIS_MACOS_MINIMUM`` and writes it as ``LSMinimumSystemVersion``
  (:func:`macos_info_plist`);
* after the freeze, build.py reads the bundle's Info.plist back, and reads the macOS each
  Mach-O file in the bundle was built for (LC_BUILD_VERSION, :func:`bundle_minimums`): what
  it compiled itself (llama.cpp, numpy) must not need a newer macOS than the bundle states.
  Wheels from PyPI may say more than their tag: PySide6 6.11.3's own modules
  (``QtCore.abi3.so``, ``libshiboken6``) say macOS 15.0 while the wheel is tagged 13.0 and
  Qt's frameworks say 13.0. dyld loads such a library on an older macOS (the number is not
  checked at load time, only what the code calls), so the build reports them and keeps the
  wheels' tag, the minimum the Qt project publishes.

The tests (tests/test_packaging.py) check offline that the minimum for the locked versions
(the ones installed in the developer's .venv, to which build.py pins the build venv) is the
largest ``macosx_X_Y`` tag of their recorded wheels. A PySide6 version that is not recorded
fails those tests with the command that shows its wheel's name (:func:`record_hint`).

Windows: Qt 6 supports Windows 10 1809 (build 17763) and later and uses the system's ICU
(icu.dll, in Windows since 1703); the .iss says ``MinVersion=10.0.17763``
(:data:`WINDOWS_MIN_VERSION`).

    python packaging/minimum_os.py            # the macOS minimum of the installed wheels, as JSON
"""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

#: Inno Setup's MinVersion for Qt 6: Windows 10 1809
WINDOWS_MIN_VERSION = "10.0.17763"

#: the distributions whose macOS wheels set the app's minimum macOS
QT_DISTRIBUTIONS = ("PySide6-Essentials", "shiboken6")

#: the macOS wheels of the PySide6 versions this project installs, as PyPI names them: read
#: once with ``pip install --dry-run --report`` (the command of :func:`record_hint`), which
#: shows the chosen file without downloading it. PySide6 6.11 and 6.12 publish one macOS
#: wheel per version (universal2); 6.12 needs macOS 14, 6.11 macOS 13.
RECORDED_MACOS_WHEELS = (
    "pyside6_essentials-6.11.0-cp310-abi3-macosx_13_0_universal2.whl",
    "shiboken6-6.11.0-cp310-abi3-macosx_13_0_universal2.whl",
    "pyside6_essentials-6.11.1-cp310-abi3-macosx_13_0_universal2.whl",
    "shiboken6-6.11.1-cp310-abi3-macosx_13_0_universal2.whl",
    "pyside6_essentials-6.11.2-cp310-abi3-macosx_13_0_universal2.whl",
    "shiboken6-6.11.2-cp310-abi3-macosx_13_0_universal2.whl",
    "pyside6_essentials-6.11.3-cp310-abi3-macosx_13_0_universal2.whl",
    "shiboken6-6.11.3-cp310-abi3-macosx_13_0_universal2.whl",
    "pyside6_essentials-6.12.0-cp310-abi3-macosx_14_0_universal2.whl",
    "shiboken6-6.12.0-cp310-abi3-macosx_14_0_universal2.whl",
)

#: which macOS platform-tag architectures run on a machine of each architecture
_TAG_ARCHES = {
    "arm64": {"arm64", "universal2"},
    "x86_64": {"x86_64", "universal2", "intel", "fat64", "fat3", "universal"},
}

Version = tuple[int, int]


class MinimumError(Exception):
    pass


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def fmt(version: Version) -> str:
    """``(13, 0)`` -> ``"13.0"`` (LSMinimumSystemVersion, MACOSX_DEPLOYMENT_TARGET)."""
    return f"{version[0]}.{version[1]}"


def parse_version(text: str) -> Version:
    """``"13.0"``, ``"13"`` or ``"13.0.1"`` -> ``(13, 0)``."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?(?:\.\d+)?", text.strip())
    if not match:
        raise MinimumError(f"not a macOS version: {text!r}")
    return int(match.group(1)), int(match.group(2) or 0)


# -- wheel tags --------------------------------------------------------------------------------


def macos_platform(tag: str) -> tuple[Version, str] | None:
    """A platform tag (or a whole ``py-abi-platform`` tag) -> ``((X, Y), arch)``, or None
    when it is not a macOS tag: ``macosx_14_0_universal2`` -> ``((14, 0), "universal2")``."""
    match = re.fullmatch(r"(?:.+-)?macosx_(\d+)_(\d+)_(\w+)", tag.strip())
    if not match:
        return None
    return (int(match.group(1)), int(match.group(2))), match.group(3)


def wheel_filename(name: str) -> tuple[str, str, list[str]]:
    """``dist-version(-build)?-py-abi-plat.whl`` -> (canonical name, version, platform tags);
    compressed tag sets (``macosx_10_9_x86_64.macosx_11_0_arm64``) are expanded."""
    parts = name.removesuffix(".whl").split("-")
    if len(parts) not in (5, 6) or not name.endswith(".whl"):
        raise MinimumError(f"not a wheel file name: {name}")
    return canonical(parts[0]), parts[1], parts[-1].split(".")


def wheel_macos_minimum(platform_tags: list[str], arch: str) -> Version | None:
    """The oldest macOS on which a wheel with these platform tags installs on ``arch``:
    the smallest of its macOS tags for that architecture (None: no such tag)."""
    arches = _TAG_ARCHES.get(arch, {arch, "universal2"})
    found = [parsed[0] for parsed in map(macos_platform, platform_tags) if parsed and parsed[1] in arches]
    return min(found) if found else None


def recorded_wheels() -> dict[tuple[str, str], list[str]]:
    """(canonical name, version) -> the platform tags of its recorded macOS wheel."""
    table: dict[tuple[str, str], list[str]] = {}
    for name in RECORDED_MACOS_WHEELS:
        dist, version, tags = wheel_filename(name)
        table.setdefault((dist, version), []).extend(tags)
    return table


def record_hint(dist: str, version: str) -> str:
    return (f"{dist} {version} is not in packaging/minimum_os.py's RECORDED_MACOS_WHEELS; its macOS wheel's name "
            f"(no download): pip install --dry-run --ignore-installed --no-deps --only-binary=:all: "
            f"--platform macosx_15_0_universal2 --platform macosx_15_0_arm64 --target /tmp/x --report - "
            f"'{dist}=={version}' | grep '\"url\"'")


def recorded_macos_minimum(versions: dict[str, str], arch: str = "arm64") -> Version:
    """The macOS minimum for these versions (``{"PySide6-Essentials": "6.12.0", ...}``) from
    the recorded wheels: the largest of the wheels' minimums."""
    table = recorded_wheels()
    minimums = []
    for dist, version in versions.items():
        tags = table.get((canonical(dist), version))
        if tags is None:
            raise MinimumError(record_hint(dist, version))
        minimum = wheel_macos_minimum(tags, arch)
        if minimum is None:
            raise MinimumError(f"the recorded wheel of {dist} {version} has no macOS tag for {arch}")
        minimums.append(minimum)
    if not minimums:
        raise MinimumError("no distributions given")
    return max(minimums)


def installed_wheel_tags(dist: str) -> list[str]:
    """The ``Tag:`` lines of an installed distribution's ``*.dist-info/WHEEL`` file."""
    from importlib import metadata

    try:
        text = metadata.distribution(dist).read_text("WHEEL")
    except metadata.PackageNotFoundError as exc:
        raise MinimumError(f"{dist} is not installed in {sys.executable}") from exc
    if not text:
        raise MinimumError(f"{dist} has no WHEEL file (not installed from a wheel)")
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def installed_versions(dists: tuple[str, ...] = QT_DISTRIBUTIONS) -> dict[str, str]:
    """The installed versions: the locked ones (build.py pins the build venv to the versions
    installed in the interpreter running it)."""
    from importlib import metadata

    versions = {}
    for dist in dists:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError as exc:
            raise MinimumError(f"{dist} is not installed in {sys.executable}") from exc
    return versions


def installed_macos_minimum(arch: str, dists: tuple[str, ...] = QT_DISTRIBUTIONS) -> dict:
    """What the installed macOS wheels need, read from their WHEEL files (run on macOS, in the
    build venv): ``{"minimum": "14.0", "wheels": {dist: {"version", "tags", "minimum"}}}``."""
    wheels = {}
    for dist, version in installed_versions(dists).items():
        tags = installed_wheel_tags(dist)
        minimum = wheel_macos_minimum([t.rsplit("-", 1)[-1] for t in tags], arch)
        if minimum is None:
            raise MinimumError(f"{dist} {version} is not a macOS wheel for {arch} (tags: {', '.join(tags)})")
        wheels[dist] = {"version": version, "tags": tags, "minimum": fmt(minimum)}
    return {"minimum": fmt(max(parse_version(w["minimum"]) for w in wheels.values())), "arch": arch,
            "wheels": wheels}


def check_against_record(found: dict) -> str | None:
    """Compare :func:`installed_macos_minimum`'s answer with the recorded wheels: raises when
    they disagree, returns a warning when the versions are not recorded, else None."""
    versions = {dist: info["version"] for dist, info in found["wheels"].items()}
    try:
        recorded = recorded_macos_minimum(versions, found["arch"])
    except MinimumError as exc:
        return str(exc)
    if fmt(recorded) != found["minimum"]:
        raise MinimumError(f"the installed wheels need macOS {found['minimum']} but the recorded wheels of "
                           f"{versions} say {fmt(recorded)}: correct RECORDED_MACOS_WHEELS in packaging/minimum_os.py")
    return None


# -- the bundle's Info.plist -------------------------------------------------------------------


def macos_info_plist(version: str, minimum: str, bundle_name: str = "Iris Desktop") -> dict:
    """The keys the spec gives PyInstaller's BUNDLE (which adds CFBundleExecutable,
    CFBundleIdentifier, CFBundleIconFile, CFBundlePackageType and writes Contents/Info.plist)."""
    parse_version(minimum)  # refuses anything but X.Y
    return {
        "CFBundleName": bundle_name,
        "CFBundleDisplayName": bundle_name,
        "CFBundleShortVersionString": version,
        "CFBundleVersion": version,
        "LSMinimumSystemVersion": minimum,
        "LSApplicationCategoryType": "public.app-category.productivity",
        "NSHighResolutionCapable": True,
        "NSRequiresAquaSystemAppearance": False,
        "NSHumanReadableCopyright": "MIT License",
    }


# -- Mach-O: the macOS each binary in the bundle was built for ---------------------------------

_MH_MAGIC = {b"\xfe\xed\xfa\xce": (">", 28), b"\xce\xfa\xed\xfe": ("<", 28),
             b"\xfe\xed\xfa\xcf": (">", 32), b"\xcf\xfa\xed\xfe": ("<", 32)}
_FAT_MAGIC = {b"\xca\xfe\xba\xbe": 20, b"\xca\xfe\xba\xbf": 32}  # fat_arch, fat_arch_64 sizes
LC_VERSION_MIN_MACOSX = 0x24
LC_BUILD_VERSION = 0x32
PLATFORM_MACOS = 1


def _decode(packed: int) -> tuple[int, int, int]:
    return packed >> 16, (packed >> 8) & 0xFF, packed & 0xFF


def _thin_minimum(data: bytes, offset: int) -> tuple[int, int, int] | None:
    endian, header_size = _MH_MAGIC[data[offset:offset + 4]]
    ncmds, sizeofcmds = struct.unpack_from(endian + "II", data, offset + 16)
    pos, end = offset + header_size, offset + header_size + sizeofcmds
    for _ in range(ncmds):
        if pos + 8 > min(end, len(data)):
            break
        cmd, cmdsize = struct.unpack_from(endian + "II", data, pos)
        if cmd == LC_BUILD_VERSION:
            platform, minos = struct.unpack_from(endian + "II", data, pos + 8)
            if platform == PLATFORM_MACOS:
                return _decode(minos)
        elif cmd == LC_VERSION_MIN_MACOSX:
            (version,) = struct.unpack_from(endian + "I", data, pos + 8)
            return _decode(version)
        if cmdsize < 8:
            break
        pos += cmdsize
    return None


def macho_minimums(path: Path) -> list[tuple[int, int, int]]:
    """The macOS versions a Mach-O file (thin or universal) was built for, one per
    architecture that says; [] for anything that is not Mach-O."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
            if head[:4] not in _MH_MAGIC and head[:4] not in _FAT_MAGIC:
                return []
            data = head + fh.read()
    except OSError:
        return []
    if data[:4] in _MH_MAGIC:
        found = _thin_minimum(data, 0)
        return [found] if found else []
    (nfat,) = struct.unpack_from(">I", data, 4)
    if nfat > 20:  # 0xcafebabe is also a Java class file, whose version follows
        return []
    arch_size = _FAT_MAGIC[data[:4]]
    result = []
    for i in range(nfat):
        base = 8 + i * arch_size
        if arch_size == 20:
            offset = struct.unpack_from(">I", data, base + 8)[0]
        else:
            offset = struct.unpack_from(">Q", data, base + 8)[0]
        if data[offset:offset + 4] in _MH_MAGIC:
            found = _thin_minimum(data, offset)
            if found:
                result.append(found)
    return result


def bundle_minimums(root: Path) -> dict[str, Version]:
    """Each Mach-O file under ``root`` (relative path) -> the newest macOS any of its
    architectures was built for. Symlinks are not followed."""
    found: dict[str, Version] = {}
    for path in sorted(Path(root).rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        versions = macho_minimums(path)
        if versions:
            found[path.relative_to(root).as_posix()] = max(v[:2] for v in versions)
    return found


def bundle_macos_minimum(root: Path) -> tuple[Version, list[str]]:
    """The newest macOS any Mach-O file under ``root`` was built for, and those files;
    ``((0, 0), [])`` when there is none."""
    found = bundle_minimums(root)
    if not found:
        return (0, 0), []
    newest = max(found.values())
    return newest, [rel for rel, version in found.items() if version == newest]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import platform

    parser = argparse.ArgumentParser(description="The macOS minimum of the installed PySide6 wheels, as JSON.")
    machine = {"aarch64": "arm64"}.get(platform.machine().lower(), platform.machine().lower())
    parser.add_argument("--arch", default=machine, help="arm64 or x86_64 (default: this machine's)")
    opts = parser.parse_args(argv)
    try:
        print(json.dumps(installed_macos_minimum(opts.arch)))
    except MinimumError as exc:
        print(f"minimum_os.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
