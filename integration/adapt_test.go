package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddytest"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	_ "github.com/llm-route/caddy-llm-route"
)

// TestCaddyfileAdapt runs the golden files in caddyfile_adapt/, as Caddy's own
// integration tests do: each file is a Caddyfile, a line of ten dashes, then
// either the JSON that `caddy adapt` must print (compared line by line) or,
// when that part does not start with '{', text the adapt error must contain.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("caddyfile_adapt", "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden files in caddyfile_adapt/")
	}
	newlines := regexp.MustCompile(`\r?\n`)
	for _, path := range files {
		name := filepath.Base(path)
		t.Run(strings.TrimSuffix(name, ".caddyfiletest"), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			text := newlines.ReplaceAllString(string(data), "\n")
			caddyfileText, expected, ok := strings.Cut(text, "\n----------\n")
			if !ok {
				t.Fatalf("%s: no ---------- separator line", name)
			}
			caddyfileText = strings.TrimSpace(caddyfileText) + "\n"
			expected = strings.TrimSpace(expected)

			if strings.HasPrefix(expected, "{") {
				if !caddytest.CompareAdapt(t, name, caddyfileText, "caddyfile", expected) {
					t.Errorf("%s: adapted JSON differs (diff printed above)", name)
				}
				return
			}
			_, _, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfileText), nil)
			if err == nil {
				t.Fatalf("%s: want an error containing %q, got none", name, expected)
			}
			if !strings.Contains(err.Error(), expected) {
				t.Errorf("%s: error\n%s\ndoes not contain\n%s", name, err, expected)
			}
		})
	}
}
