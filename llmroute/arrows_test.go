package llmroute

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The arrows the package doc says never exist, checked on the source.

const modulePath = "github.com/llm-route/caddy-llm-route"

// TestArrowsBetweenPackages: the ledger never imports the core (so it
// cannot call the queue, placement or the attempts) nor Caddy's HTTP code;
// the pure packages import neither Caddy nor the core; the core never
// imports its Caddyfile face.
func TestArrowsBetweenPackages(t *testing.T) {
	core := modulePath + "/llmroute"
	type arrow struct {
		dir, what string
		match     func(imp string) bool
	}
	toCore := func(imp string) bool { return imp == core }
	toCaddy := func(imp string) bool { return strings.HasPrefix(imp, "github.com/caddyserver/") }
	never := []arrow{
		{"ledger", "the core", toCore},
		{"ledger", "Caddy's HTTP code", func(imp string) bool { return strings.Contains(imp, "/caddy/v2/modules/") }},
		{".", "the caddyfile package", func(imp string) bool { return imp == modulePath+"/caddyfile" }},
	}
	for _, pure := range []string{"transform", "wire/anthropic", "wire/responses", "keys", "redisstate", "internal/jsonscan", "placement"} {
		never = append(never, arrow{pure, "Caddy", toCaddy}, arrow{pure, "the core", toCore})
	}
	for _, n := range never {
		for file, imps := range imports(t, n.dir) {
			for _, imp := range imps {
				if n.match(imp) {
					t.Errorf("%s imports %s (%s): an arrow to %s must not exist", file, imp, n.dir, n.what)
				}
			}
		}
	}
}

// TestNoAPIBranchOutsideCodecs: which client API a request speaks is asked
// of its codec; the API and front constants of the non-chat APIs appear
// only in the codecs, the tables that map paths and APIs to them, the
// probe table (data), and count_tokens (Messages' own endpoint).
func TestNoAPIBranchOutsideCodecs(t *testing.T) {
	allowed := map[string]bool{"front.go": true, "apis.go": true, "provision.go": true, "count_tokens.go": true}
	names := regexp.MustCompile(`\b(api|front)(Messages|Responses|Embeddings|Completions)\b`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || strings.HasPrefix(f, "codec") || allowed[f] {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(src), "\n") {
			if code, _, _ := strings.Cut(line, "//"); names.MatchString(code) {
				t.Errorf("%s:%d names a client API outside the codecs: %s", f, i+1, strings.TrimSpace(line))
			}
		}
	}
}

// imports returns the imports of every non-test Go file in dir, by file.
func imports(t *testing.T, dir string) map[string][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", dir, err)
	}
	out := make(map[string][]string)
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range f.Imports {
			if p, err := strconv.Unquote(s.Path.Value); err == nil {
				out[name] = append(out[name], p)
			}
		}
	}
	return out
}
