#!/usr/bin/env bash
# Build (and optionally run) Caddy with the llm_route module from this
# checkout. Needs only Go; xcaddy is installed through the Go module proxy.
#
#   ./xcaddy.sh build              -> ./caddy
#   ./xcaddy.sh run [caddy args]   -> build, then `./caddy run --config Caddyfile.example --adapter caddyfile`
#                                     (or with your args instead)
#
# Environment: CADDY_VERSION (default v2.11.9), XCADDY_VERSION (default
# v0.4.5), OUTPUT (default ./caddy).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

CADDY_VERSION="${CADDY_VERSION:-v2.11.9}"
XCADDY_VERSION="${XCADDY_VERSION:-v0.4.5}"
OUTPUT="${OUTPUT:-$here/caddy}"
MODULE="$(go list -m)"

gobin="$(go env GOBIN)"
[ -n "$gobin" ] || gobin="$(go env GOPATH)/bin"
xcaddy="$gobin/xcaddy"
if ! "$xcaddy" version 2>/dev/null | grep -q "${XCADDY_VERSION}"; then
  echo "installing xcaddy ${XCADDY_VERSION}" >&2
  GOFLAGS= go install "github.com/caddyserver/xcaddy/cmd/xcaddy@${XCADDY_VERSION}"
fi

build() {
  # A local --with MOD=DIR makes xcaddy `go get MOD`; pinning the zero
  # pseudo-version keeps the module proxy from being asked for an
  # unpublished path.
  "$xcaddy" build "$CADDY_VERSION" \
    --output "$OUTPUT" \
    --with "${MODULE}@v0.0.0-00010101000000-000000000000=${here}"
  "$OUTPUT" list-modules --skip-standard | grep -q '^http.handlers.llm_route$' || {
    echo "built caddy lacks http.handlers.llm_route" >&2
    exit 1
  }
  echo "built $OUTPUT with http.handlers.llm_route" >&2
}

cmd="${1:-build}"
shift || true
case "$cmd" in
  build)
    build
    ;;
  run)
    build
    if [ "$#" -eq 0 ]; then
      set -- run --config "$here/Caddyfile.example" --adapter caddyfile
    fi
    exec "$OUTPUT" "$@"
    ;;
  *)
    echo "usage: $0 build | run [caddy args…]" >&2
    exit 2
    ;;
esac
