#!/usr/bin/env bash
# The test suite on a machine with only Go and the distribution's package
# manager. It installs what the tests need and is missing, then runs
#
#   go test -race -count=1 ./...
#
# What the tests need besides Go:
#   redis-server  the shared-state tests start their own (they fail without it)
#   chromium      the status page test runs in a real headless browser
#                 (LLMROUTE_NO_BROWSER=1 skips that one test; LLMROUTE_CHROMIUM
#                 names another Chrome/Chromium binary)
#   gcc           -race needs cgo, so a C compiler
#   Ollama        the real-engine tests (integration/realengine_test.go) run
#                 a real Ollama, which integration/realup/build.sh builds once
#                 from the Go module proxy (3-7 min; then it is kept in the
#                 user cache folder); the build needs g++, nlohmann-json3-dev
#                 and libstb-dev. Skipped when no package argument includes
#                 ./integration/, or when LLMROUTE_OLLAMA names a binary.
# On Debian and Ubuntu they are installed with apt-get (through sudo when not
# root); elsewhere the script names the packages to install and stops.
#
# Arguments go to `go test`: flags before the default package list, and any
# package argument (./x/..., ./integration/) replaces ./...:
#   ./test.sh                               the whole suite
#   ./test.sh -run TestExamples ./integration/
#   ./test.sh -v -run 'TestKeys' ./integration/
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

if ! command -v go >/dev/null; then
  echo "test.sh: Go is not installed (https://go.dev/dl/; go.mod names the version)" >&2
  exit 1
fi

# have_browser mirrors how the browser test looks for one.
have_browser() {
  [ -n "${LLMROUTE_CHROMIUM:-}" ] && [ -x "$LLMROUTE_CHROMIUM" ] && return 0
  [ -x /usr/bin/chromium ] && return 0
  for b in chromium chromium-browser google-chrome; do
    command -v "$b" >/dev/null && return 0
  done
  return 1
}

have_cc() {
  local cc
  cc="$(go env CC)"
  command -v "${cc%% *}" >/dev/null
}

# Any package argument replaces the default ./... .
pkgs=(./...)
named=()
for a in "$@"; do
  case "$a" in
    ./* | ../* | all | std | */...) named+=("$a") ;;
  esac
done
engine=1 # whether the packages tested include ./integration/
if [ "${#named[@]}" -gt 0 ]; then
  pkgs=()
  engine=0
  for a in "${named[@]}"; do
    case "$a" in
      ./... | all | ./integration | ./integration/ | ./integration/...) engine=1 ;;
    esac
  done
fi
build_engine=0
if [ "$engine" = 1 ] && [ -z "${LLMROUTE_OLLAMA:-}" ] && ! integration/realup/build.sh --check >/dev/null; then
  build_engine=1
fi

missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
[ "${LLMROUTE_NO_BROWSER:-}" = "1" ] || have_browser || missing+=(chromium)
have_cc || missing+=(gcc)
if [ "$build_engine" = 1 ]; then
  command -v g++ >/dev/null || missing+=(g++)
  [ -f /usr/include/nlohmann/json_fwd.hpp ] || missing+=(nlohmann-json3-dev)
  [ -f /usr/include/stb/stb_image.h ] || missing+=(libstb-dev)
fi

if [ "${#missing[@]}" -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
      if ! command -v sudo >/dev/null; then
        echo "test.sh: missing ${missing[*]}, and not root and no sudo to install them with apt-get" >&2
        exit 1
      fi
      sudo="sudo"
    fi
    echo "== installing ${missing[*]} (apt-get)" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  else
    echo "test.sh: missing ${missing[*]}. Install them with your package manager" >&2
    echo "  (the packages are usually named redis / redis-server, chromium, gcc, g++, nlohmann-json, stb;" >&2
    echo "  Fedora: sudo dnf install redis chromium gcc; macOS: brew install redis and Chrome," >&2
    echo "  then LLMROUTE_CHROMIUM=/path/to/chrome), or set LLMROUTE_NO_BROWSER=1 to skip the browser test," >&2
    echo "  and run ./test.sh again." >&2
    exit 1
  fi
  if [ "${LLMROUTE_NO_BROWSER:-}" != "1" ] && ! have_browser; then
    echo "test.sh: chromium was installed but no browser binary was found (on Ubuntu the package" >&2
    echo "  may be a snap stub): install Chrome or Chromium and set LLMROUTE_CHROMIUM, or set" >&2
    echo "  LLMROUTE_NO_BROWSER=1 to skip the browser test" >&2
    exit 1
  fi
fi

if [ "$build_engine" = 1 ]; then
  integration/realup/build.sh >/dev/null
fi

echo "== go test -race -count=1 $* ${pkgs[*]}" >&2
exec go test -race -count=1 "$@" ${pkgs[@]+"${pkgs[@]}"}
