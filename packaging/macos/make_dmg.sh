#!/usr/bin/env bash
# Make the macOS disk image: the app and an Applications link, with create-dmg.
#
#   packaging/macos/make_dmg.sh "dist/Iris Desktop.app" dist/iris-desktop-0.1.0-macos-arm64.dmg \
#       [build/model/LICENSE-Qwen2.5-Coder-0.5B-Instruct.txt build/model/LICENSE-all-MiniLM-L6-v2.txt
#        build/model/LICENSE-ms-marco-MiniLM-L-12-v2.txt build/model/LICENSE-bge-small-en-v1.5.txt ...]
#
# Files after the image name (packaging/build.py passes the licenses of the bundled model,
# the embedding model and recall's reranker, all Apache-2.0, and recall's bge embedder, MIT)
# are put beside the app in the
# image; the app itself also carries them, in
# Contents/Resources/models/ and in the package data that Help -> About reads.
# The app is copied with `cp -R`, which keeps the symlinks PyInstaller 6 puts inside the
# bundle (Contents/Frameworks <-> Contents/Resources); a copy that follows them breaks the
# code signature and doubles the size (pyinstaller#8927). Installs create-dmg with
# Homebrew if it is missing; falls back to hdiutil alone when Homebrew is absent.
set -euo pipefail

APP=${1:?usage: make_dmg.sh APP DMG}
DMG=${2:?usage: make_dmg.sh APP DMG}
NAME="Iris Desktop"
HERE="$(cd "$(dirname "$0")" && pwd)"

shift 2
[ -d "$APP" ] || { echo "make_dmg.sh: $APP is not a directory" >&2; exit 1; }
STAGE="$(mktemp -d)/dmg"
mkdir -p "$STAGE"
cp -R "$APP" "$STAGE/"            # -R without -L: symlinks stay symlinks
EXTRA_ARGS=()                     # where create-dmg puts the extra files in the window
X=160
for EXTRA in "$@"; do
  [ -f "$EXTRA" ] || { echo "make_dmg.sh: $EXTRA is not a file" >&2; exit 1; }
  cp "$EXTRA" "$STAGE/"
  EXTRA_ARGS+=(--icon "$(basename "$EXTRA")" "$X" 330)
  X=$((X + 140))
done
rm -f "$DMG"
mkdir -p "$(dirname "$DMG")"

if ! command -v create-dmg >/dev/null 2>&1 && command -v brew >/dev/null 2>&1; then
  brew install create-dmg
fi

if command -v create-dmg >/dev/null 2>&1; then
  ICON_ARGS=()
  if [ -f "$HERE/../../build/icons/iris.icns" ]; then
    ICON_ARGS=(--volicon "$HERE/../../build/icons/iris.icns")
  fi
  create-dmg \
    --volname "$NAME" \
    ${ICON_ARGS[@]+"${ICON_ARGS[@]}"} \
    --window-pos 200 120 \
    --window-size 600 460 \
    --icon-size 110 \
    --icon "$(basename "$APP")" 160 180 \
    --hide-extension "$(basename "$APP")" \
    --app-drop-link 440 180 \
    ${EXTRA_ARGS[@]+"${EXTRA_ARGS[@]}"} \
    --no-internet-enable \
    "$DMG" "$STAGE"
else
  echo "make_dmg.sh: create-dmg not found; plain hdiutil image" >&2
  ln -s /Applications "$STAGE/Applications"
  hdiutil create -volname "$NAME" -srcfolder "$STAGE" -ov -format UDZO "$DMG"
fi

IDENTITY="${MACOS_SIGNING_IDENTITY:-}"
if [ -z "$IDENTITY" ] && [ -f "$HERE/../../build/macos-signing-identity" ]; then
  IDENTITY="$(cat "$HERE/../../build/macos-signing-identity")"   # written by sign.sh
fi
if [ -n "$IDENTITY" ]; then
  codesign --force --sign "$IDENTITY" --timestamp "$DMG"
fi
echo "make_dmg.sh: wrote $DMG"
