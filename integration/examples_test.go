package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestExamples adapts every shipped Caddyfile example and provisions every
// example config (without starting servers), so the docs cannot rot. The
// environment variables an example reads ({env.NAME}: provider keys,
// client-key secrets) are set to a distinct value each, as a user would
// set them before starting it.
func TestExamples(t *testing.T) {
	files, _ := filepath.Glob("../examples/*")
	files = append(files, "../Caddyfile.example")
	envRef := regexp.MustCompile(`\{env\.([A-Za-z0-9_]+)\}`)
	n := 0
	for _, f := range files {
		if src, err := os.ReadFile(f); err == nil {
			for _, m := range envRef.FindAllStringSubmatch(string(src), -1) {
				t.Setenv(m[1], "example-value-of-"+m[1])
			}
		}
		var cfgJSON []byte
		switch {
		case strings.HasPrefix(filepath.Base(f), "grafana-"):
			continue // a dashboard, checked by TestDashboardAndAlertsMetricsExist
		case strings.HasSuffix(f, ".json"):
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			cfgJSON = b
		case strings.HasSuffix(f, "Caddyfile") || strings.HasSuffix(f, ".Caddyfile") || strings.HasSuffix(f, "Caddyfile.example"):
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(b, map[string]any{"filename": f})
			if err != nil {
				t.Errorf("%s: adapt: %v", f, err)
				continue
			}
			for _, w := range warnings {
				t.Errorf("%s: adapt warning: %s", f, w.String())
			}
			cfgJSON = out
		default:
			continue
		}
		n++
		if !strings.Contains(string(cfgJSON), `"handler":"llm_route"`) && !strings.Contains(string(cfgJSON), `"handler": "llm_route"`) {
			t.Errorf("%s: no llm_route handler in %s", f, cfgJSON)
		}
		var cfg caddy.Config
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if err := caddy.Validate(&cfg); err != nil {
			t.Errorf("%s: validate: %v", f, err)
		}
	}
	if n < 4 {
		t.Fatalf("only %d examples found", n)
	}
}
