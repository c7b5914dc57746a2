#!/usr/bin/env bash
# Notarize and staple the disk image, when the Apple secrets exist.
#
#   APPLE_ID, APPLE_TEAM_ID, APPLE_APP_PASSWORD (app-specific password) ->
#   packaging/macos/notarize.sh dist/iris-desktop-<version>-macos-<arch>.dmg
set -euo pipefail

DMG=${1:?usage: notarize.sh DMG}
if [ -z "${APPLE_ID:-}" ] || [ -z "${APPLE_TEAM_ID:-}" ] || [ -z "${APPLE_APP_PASSWORD:-}" ]; then
  echo "notarize.sh: APPLE_ID / APPLE_TEAM_ID / APPLE_APP_PASSWORD not set; not notarizing" >&2
  exit 0
fi
xcrun notarytool submit "$DMG" \
  --apple-id "$APPLE_ID" --team-id "$APPLE_TEAM_ID" --password "$APPLE_APP_PASSWORD" \
  --wait --timeout 30m
xcrun stapler staple "$DMG"
xcrun stapler validate "$DMG"
spctl --assess --type open --context context:primary-signature --verbose=2 "$DMG" || true
