package integration

// Issue #13 item 6: `caddy llm-route status|explain`, run in-process the way
// the caddy binary runs a registered command, against the real admin API.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// runCLI runs `caddy llm-route args...` and returns stdout and the error.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	c, ok := caddycmd.Commands()["llm-route"]
	if !ok {
		t.Fatal("the llm-route command is not registered")
	}
	cmd := &cobra.Command{Use: c.Name, Short: c.Short}
	c.CobraFunc(cmd)
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// column returns the offset of word in line, -1 if absent.
func column(out, lineStart, word string) int {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, lineStart) {
			return strings.Index(l, word)
		}
	}
	return -1
}

func TestCLIStatusAndExplain(t *testing.T) {
	v := startVisibility(t)
	addr := strings.TrimPrefix(v.p.admin, "http://")

	out, err := runCLI(t, "status", "--address", addr)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	for _, want := range []string{"UPSTREAM", "held", "1/1", "flaky", "(failure)", "limited", "(retry_after)", "0/∞",
		"MODEL", "mixed", "limited → held → free", "0/2 waiting", "PROVIDER", "p-free", "sessions 0, config loaded 20"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	// Aligned columns: each header starts where its values start.
	for _, col := range [][2]string{{"PROVIDER", "p-held"}, {"SLOTS", "1/1"}, {"COOLING", "-   "}, {"FAIL STREAK", "0   "}, {"STATE", "full"}} {
		h, r := column(out, "UPSTREAM", col[0]), column(out, "held ", col[1])
		if h < 0 || h != r {
			t.Errorf("column %s at %d, its value %q at %d:\n%s", col[0], h, col[1], r, out)
		}
	}

	out, err = runCLI(t, "explain", "mixed", "--address", addr, "--tokens", "1200")
	if err != nil {
		t.Fatalf("explain: %v\n%s", err, out)
	}
	for _, want := range []string{"UPSTREAM", "VERDICT", "limited", "cooling", "held", "busy", "free", "available", "←",
		"a request for mixed would go to free"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	if column(out, "#", "VERDICT") != column(out, "2 ", "busy") {
		t.Errorf("explain columns not aligned:\n%s", out)
	}
	out, _ = runCLI(t, "explain", "chat", "--address", addr)
	if !strings.Contains(out, "would wait in the queue") {
		t.Errorf("explain chat:\n%s", out)
	}

	_, err = runCLI(t, "explain", "nope", "--address", addr)
	if err == nil || err.Error() != `model "nope" does not exist` {
		t.Errorf("explain of an unknown model: err = %v", err)
	}
	if _, err := runCLI(t, "explain", "--address", addr); err == nil {
		t.Error("explain without a model succeeded")
	}
}

func TestCLIAdminUnreachableOrOff(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens
	for _, args := range [][]string{{"status", "--address", addr}, {"explain", "m", "--address", addr}} {
		out, err := runCLI(t, args...)
		if err == nil || !strings.Contains(err.Error(), "cannot reach Caddy's admin API at "+addr) {
			t.Errorf("%v: err = %v, out %q; want a clear unreachable error", args, err, out)
		}
	}

	cfgPath := filepath.Join(t.TempDir(), "caddy.json")
	if err := os.WriteFile(cfgPath, []byte(`{"admin":{"disabled":true}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := runCLI(t, "status", "--config", cfgPath)
	if err == nil || !strings.Contains(err.Error(), "admin API is disabled") {
		t.Errorf("status with admin off: err = %v", err)
	}
}
