package llmproxy

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	day := 24 * time.Hour
	good := []struct {
		in   string
		want time.Duration
	}{
		{"PT30S", 30 * time.Second},
		{"PT15M", 15 * time.Minute},
		{"PT1H15M", 75 * time.Minute},
		{"PT1M30S", 90 * time.Second},
		{"PT0S", 0},
		{"PT0.5S", 500 * time.Millisecond},
		{"PT500MS", 500 * time.Millisecond},
		{"P1D", day},
		{"P1W", 7 * day},
		{"P1M", 30 * day},
		{"P1Y", 365 * day},
		{"P1DT12H", 36 * time.Hour},
		{"pt5s", 5 * time.Second},
		{" PT5S ", 5 * time.Second},
		// Kotlin's Duration.parse also takes its own unit form.
		{"30s", 30 * time.Second},
		{"1h 30m", 90 * time.Minute},
		{"500ms", 500 * time.Millisecond},
		{"1d", day},
	}
	for _, c := range good {
		got, err := parseDuration(c.in)
		if err != nil || got != c.want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", c.in, got, err, c.want)
		}
	}
	bad := []string{
		"", " ", "5 minutes", "P", "PT", "P1S", "PT1D", "PT1H1H", "PT-1S",
		"-PT1S", "-1s", "1h30", "30", "abc", "P1Y2", "PTS", "1 h", "P99999999999Y",
	}
	for _, in := range bad {
		if d, err := parseDuration(in); err == nil {
			t.Errorf("parseDuration(%q) = %v, want an error", in, d)
		} else if !strings.Contains(err.Error(), "invalid ISO-8601 duration") {
			t.Errorf("parseDuration(%q): error %q does not say what is wrong", in, err)
		}
	}
}

// handlerOf adapts y and returns the llm_route handler object.
func handlerOf(t *testing.T, y string) (map[string]any, []string) {
	t.Helper()
	out, warnings, err := Adapter{}.Adapt([]byte(y), nil)
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []map[string]any `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber() // numbers as written, beyond float64's precision
	if err := dec.Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	var ws []string
	for _, w := range warnings {
		ws = append(ws, w.String())
	}
	return cfg.Apps.HTTP.Servers["llmproxy"].Routes[1].Handle[0], ws
}

func TestEmptyFileServesTheDefaults(t *testing.T) {
	for _, y := range []string{"", "# nothing yet\n", "~\n"} {
		out, w, err := Adapter{}.Adapt([]byte(y), nil)
		if err != nil || len(w) > 0 || !strings.Contains(string(out), `"listen":["0.0.0.0:8100"]`) {
			t.Errorf("%q: %s %v %v", y, out, w, err)
		}
	}
}

func TestKeyReferences(t *testing.T) {
	cases := []struct{ key, want string }{
		{`"${ROUTER_API_KEY}"`, "{env.ROUTER_API_KEY}"},
		{`"sk-${A}-${B_2}"`, "sk-{env.A}-{env.B_2}"},
		// Braces that are no reference stay literal, as the original kept them.
		{`"${A}{x}"`, `{env.A}\{x\}`},
		{`"${not-a-name}"`, `$\{not-a-name\}`},
	}
	for _, c := range cases {
		h, _ := handlerOf(t, "providers:\n  - id: p\n    url: \"http://h/v1\"\n    key: "+c.key+"\n")
		got := h["providers"].([]any)[0].(map[string]any)["key"]
		if got != c.want {
			t.Errorf("key %s: got %q, want %q", c.key, got, c.want)
		}
	}
}

func TestPatchIsJSON(t *testing.T) {
	y := `
base: &base
  temperature: 0.2
  stop: ["a", "b"]
providers:
  - id: p
    url: "http://h/v1"
    patch:
      <<: *base
      temperature: 0.5
      n: 0x10
      big: 18446744073709551615
      flag: yes
      none: ~
      when: 2024-01-02
      nested: {a: [1, {b: true}]}
`
	h, warnings := handlerOf(t, y)
	patch, _ := json.Marshal(h["providers"].([]any)[0].(map[string]any)["patch"])
	want := `{"big":18446744073709551615,"flag":"yes","n":16,"nested":{"a":[1,{"b":true}]},"none":null,"stop":["a","b"],"temperature":0.5,"when":"2024-01-02"}`
	if string(patch) != want {
		t.Errorf("patch %s, want %s", patch, want)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], `unknown key "base"`) {
		t.Errorf("warnings %v, want the unknown key base", warnings)
	}
}

func TestRefusesWhatCannotBeJSON(t *testing.T) {
	for name, y := range map[string]string{
		"cycle":     "providers:\n  - &a\n    id: p\n    url: \"http://h/v1\"\n    patch: {self: *a}\n",
		"nan":       "providers:\n  - id: p\n    url: \"http://h/v1\"\n    patch: {x: .nan}\n",
		"duplicate": "providers:\n  - id: p\n    id: q\n    url: \"http://h/v1\"\n",
		"laughs":    laughs(),
		"top list":  "- a\n- b\n",
	} {
		if _, _, err := (Adapter{}).Adapt([]byte(y), nil); err == nil || !strings.HasPrefix(err.Error(), "config.yaml:") {
			t.Errorf("%s: error %v, want one naming config.yaml and its line", name, err)
		}
	}
}

// laughs is a patch whose aliases expand to 10^9 nodes.
func laughs() string {
	var b strings.Builder
	b.WriteString("l0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 9; i++ {
		b.WriteString("l" + string(rune('0'+i)) + ": &l" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*l" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	b.WriteString("providers:\n  - id: p\n    url: \"http://h/v1\"\n    patch: {x: *l9}\n")
	return b.String()
}

// FuzzAdapt: no input makes the adapter panic or hang, and what it accepts
// is a JSON config.
func FuzzAdapt(f *testing.F) {
	if b, err := os.ReadFile("../examples/llm-proxy-config.yaml"); err == nil {
		f.Add(string(b))
	}
	f.Add("server:\n  port: 8100\nproviders: []\n")
	f.Add("providers:\n  - &a {id: p, url: \"http://h\", patch: {x: *a}}\n")
	f.Add("upstreams:\n  - {id: u, provider: p, model: m, backoff: P1Y2M3DT4H5M6.5S}\n")
	f.Add("models:\n  - name: m\n    upstreams: [a, a]\n    patch:\n      <<: [{a: 1}, {b: 2}]\n")
	f.Fuzz(func(t *testing.T, y string) {
		out, _, err := Adapter{}.Adapt([]byte(y), map[string]any{"filename": "f.yaml"})
		if err != nil {
			return
		}
		var cfg map[string]any
		if err := json.Unmarshal(out, &cfg); err != nil {
			t.Fatalf("accepted %q but wrote invalid JSON: %v", y, err)
		}
	})
}
