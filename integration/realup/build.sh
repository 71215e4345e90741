#!/usr/bin/env bash
# Builds the real Ollama that TestRealEngine* runs (CPU only, from the Go
# module proxy), once: it does nothing when the binary is already there.
# Prints the binary's path as the last line.
#
#   integration/realup/build.sh            (./test.sh runs it)
#   FORCE=1 integration/realup/build.sh    rebuild
#   integration/realup/build.sh --check    exit 0 when built, 1 when not
#
# The binary goes to $LLMROUTE_OLLAMA_DIR, by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/llm-route/ollama-<version>/ (the tests
# look there, or at $LLMROUTE_OLLAMA). A first build (cgo compiles
# llama.cpp and ggml) with an empty Go build cache took 3 min on a quiet
# two-core machine and 7 min on a busy one.
#
# Needs Go, a C and C++ compiler, and Debian's nlohmann-json3-dev and
# libstb-dev: `go install github.com/ollama/ollama@v0.17.4` alone fails,
# because Go module zips leave out every "vendor" folder and llama.cpp keeps
# its third-party headers in one. nlohmann/json and stb_image come from
# Debian; miniaudio (audio input of multimodal models only, which text
# models never use) from the stub in shim/.
set -euo pipefail
VER=v0.17.4
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DIR="${LLMROUTE_OLLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/llm-route/ollama-${VER#v}}"
BIN="$DIR/ollama"

# The version check talks to no server (OLLAMA_HOST points nowhere): it only
# prints the client's version.
if [ -z "${FORCE:-}" ] && [ -x "$BIN" ] &&
  OLLAMA_HOST=127.0.0.1:1 "$BIN" -v 2>&1 | grep -q "version is ${VER#v}\$"; then
  echo "$BIN"
  exit 0
fi
[ "${1:-}" = --check ] && exit 1

missing=""
[ -f /usr/include/nlohmann/json_fwd.hpp ] || missing="$missing nlohmann-json3-dev"
[ -f /usr/include/stb/stb_image.h ] || missing="$missing libstb-dev"
command -v g++ >/dev/null || missing="$missing g++"
if [ -n "$missing" ]; then
  echo "build.sh: missing$missing (Debian/Ubuntu: apt-get install$missing; ./test.sh installs them)" >&2
  exit 1
fi

mkdir -p "$DIR"
LOG="$DIR/build.log"
echo "== building github.com/ollama/ollama@$VER into $DIR (3-7 min; log $LOG)" >&2
start=$(date +%s)
# Outside any module, with GOFLAGS of its own: the caller's (-race, -mod=vendor,
# a test's -tags) must not reach this build. -X sets the version the binary
# reports (else 0.0.0).
if ! (cd "$DIR" && GOFLAGS="-mod=mod -buildvcs=false" GOBIN="$DIR" CGO_ENABLED=1 \
  CGO_CPPFLAGS="-I$HERE/shim" \
  go install -ldflags "-X github.com/ollama/ollama/version.Version=${VER#v}" \
  "github.com/ollama/ollama@$VER") >"$LOG" 2>&1; then
  echo "build.sh: building Ollama failed; the end of $LOG:" >&2
  tail -30 "$LOG" >&2
  exit 1
fi
echo "== built Ollama $VER in $(($(date +%s) - start)) s" >&2
echo "$BIN"
