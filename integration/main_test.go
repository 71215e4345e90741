package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// TestMain points Caddy's default storage at a directory of this run:
// configs loaded without a storage of their own (the README and example
// tests) would otherwise write what llm_route persists, such as the key
// usage, into the user's Caddy data directory, and a later run would read
// it back.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "llm-route-test-storage-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	caddy.DefaultStorage.Path = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
