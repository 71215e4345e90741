package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// TestDocsLinks checks every relative link in README.md, docs/ and
// examples/README.md: the file it names exists, and a #fragment names a
// heading of that page (as GitHub makes anchors of headings). The README
// links to the pages in docs/ and they link back, so a moved or renamed
// section would otherwise leave dead links behind.
func TestDocsLinks(t *testing.T) {
	pages, _ := filepath.Glob("../docs/*.md")
	pages = append(pages, "../README.md", "../examples/README.md")
	if len(pages) < 4 {
		t.Fatalf("only %d pages found: %v", len(pages), pages)
	}
	fence := regexp.MustCompile("(?s)```.*?```")
	heading := regexp.MustCompile(`(?m)^#+ (.*)$`)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return fence.ReplaceAllString(string(b), "")
	}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(read(path), -1) {
			a[githubAnchor(m[1])] = true
		}
		anchors[path] = a
		return a
	}
	n := 0
	for _, page := range pages {
		for _, m := range link.FindAllStringSubmatch(read(page), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %q: %v", page, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: link %q: %s has no heading with that anchor", page, target, path)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d relative links found: the link pattern no longer matches", n)
	}
}

// githubAnchor is the anchor GitHub gives a heading: lower case, characters
// other than letters, digits, '-', '_' and spaces dropped, spaces as '-'.
func githubAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
