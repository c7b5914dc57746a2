#!/usr/bin/env bash
# Sign the app with a Developer ID certificate (hardened runtime), when the secrets exist.
#
#   MACOS_CERTIFICATE (base64 .p12), MACOS_CERTIFICATE_PWD -> packaging/macos/sign.sh APP
#
# Imports the certificate into a temporary keychain, signs every Mach-O file inside out,
# then the bundle, and leaves the identity in build/macos-signing-identity for make_dmg.sh. Without MACOS_CERTIFICATE it does
# nothing: the app keeps PyInstaller's ad-hoc signature.
set -euo pipefail

APP=${1:?usage: sign.sh APP}
if [ -z "${MACOS_CERTIFICATE:-}" ]; then
  echo "sign.sh: MACOS_CERTIFICATE not set; not signing" >&2
  exit 0
fi
: "${MACOS_CERTIFICATE_PWD:?MACOS_CERTIFICATE_PWD must be set with MACOS_CERTIFICATE}"
HERE="$(cd "$(dirname "$0")" && pwd)"
ENTITLEMENTS="$HERE/entitlements.plist"

KEYCHAIN="${RUNNER_TEMP:-$(mktemp -d)}/iris-signing.keychain-db"
KEYCHAIN_PWD="$(uuidgen)"
CERT="$(dirname "$KEYCHAIN")/certificate.p12"
echo "$MACOS_CERTIFICATE" | base64 --decode > "$CERT"
security create-keychain -p "$KEYCHAIN_PWD" "$KEYCHAIN"
security set-keychain-settings -lut 21600 "$KEYCHAIN"
security unlock-keychain -p "$KEYCHAIN_PWD" "$KEYCHAIN"
security import "$CERT" -P "$MACOS_CERTIFICATE_PWD" -A -t cert -f pkcs12 -k "$KEYCHAIN"
security set-key-partition-list -S apple-tool:,apple:,codesign: -s -k "$KEYCHAIN_PWD" "$KEYCHAIN" >/dev/null
# add the keychain to the user's search list, keeping the ones already there (each printed
# quoted and indented, one a line; a path may hold spaces: no word splitting)
KEYCHAINS=("$KEYCHAIN")
while IFS= read -r line; do
  line="${line#"${line%%[![:space:]]*}"}"
  line="${line#\"}"
  line="${line%\"}"
  if [ -n "$line" ]; then KEYCHAINS+=("$line"); fi
done < <(security list-keychains -d user)
security list-keychains -d user -s "${KEYCHAINS[@]}"
rm -f "$CERT"

IDENTITY="$(security find-identity -v -p codesigning "$KEYCHAIN" | grep -m1 'Developer ID Application' \
  | sed -E 's/.*"(.*)"/\1/')"
[ -n "$IDENTITY" ] || { echo "sign.sh: no 'Developer ID Application' identity in the certificate" >&2; exit 1; }
echo "sign.sh: signing with $IDENTITY"

# inside out: every dylib/so/framework binary first, then the executable, then the bundle
find "$APP/Contents" -type f \( -name '*.dylib' -o -name '*.so' -o -perm -u+x \) -print0 |
  while IFS= read -r -d '' f; do
    if file "$f" | grep -q 'Mach-O'; then
      codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$IDENTITY" "$f"
    fi
  done
codesign --force --timestamp --options runtime --entitlements "$ENTITLEMENTS" --sign "$IDENTITY" "$APP"
codesign --verify --deep --strict --verbose=2 "$APP"

# make_dmg.sh signs the image with the same identity
mkdir -p "$HERE/../../build"
printf '%s\n' "$IDENTITY" > "$HERE/../../build/macos-signing-identity"
if [ -n "${GITHUB_ENV:-}" ]; then
  echo "MACOS_SIGNING_IDENTITY=$IDENTITY" >> "$GITHUB_ENV"
fi
