package llmroute

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestRuleValidation: every check of a router model names the model and
// the rule, in the exact words an operator reads.
func TestRuleValidation(t *testing.T) {
	providers := []Provider{{ID: "p", URL: "http://127.0.0.1:1/v1"}}
	upstreams := []Upstream{{ID: "u", Provider: "p", Model: "m"}}
	plain := func(name string) Model { return Model{Name: name, Upstreams: []string{"u"}} }
	catchAll := Rule{Name: "any", Use: []string{"a"}}
	router := func(rules ...Rule) Model { return Model{Name: "auto", Rules: rules} }
	ms := func(extra ...Model) []Model { return append([]Model{plain("a"), plain("b")}, extra...) }
	d := func(s string) *Duration { v, _ := ParseDuration(s); x := Duration(v); return &x }
	for _, tc := range []struct {
		name   string
		models []Model
		want   string
	}{
		{"both lists", ms(Model{Name: "auto", Upstreams: []string{"u"}, Rules: []Rule{catchAll}}), `model "auto": set upstreams or rules, not both`},
		{"neither", ms(Model{Name: "auto"}), `model "auto": needs at least one upstream or rule`},
		{"no rule name", ms(router(catchAll, Rule{Use: []string{"a"}})), `model "auto": rules[1]: name is required`},
		{"duplicate rule", ms(router(catchAll, catchAll)), `model "auto": rule "any": duplicate name`},
		{"effort", ms(router(catchAll, Rule{Name: "x", Effort: "hard", Use: []string{"a"}})), `model "auto": rule "x": effort: want low, medium or high, got "hard"`},
		{"use empty", ms(router(catchAll, Rule{Name: "x"})), `model "auto": rule "x": use: needs at least one model`},
		{"unknown in use", ms(router(catchAll, Rule{Name: "x", Use: []string{"gemini-pro"}})), `model "auto": rule "x": use: unknown model "gemini-pro"`},
		{"router in use", ms(router(catchAll, Rule{Name: "x", Use: []string{"auto2"}}), Model{Name: "auto2", Rules: []Rule{catchAll}}),
			`model "auto": rule "x": use: "auto2" is a router model; a rule's chain names plain models`},
		{"itself in use", ms(router(Rule{Name: "x", Use: []string{"auto"}})), `model "auto": rule "x": use: "auto" is a router model`},
		{"twice in use", ms(router(Rule{Name: "x", Use: []string{"a", "a"}})), `model "auto": rule "x": use: model "a" listed twice`},
		{"weights misaligned", ms(router(Rule{Name: "x", Use: []string{"a", "b"}, Weights: []int{90, 5, 5}})), `model "auto": rule "x": weights: want one per model in use (2), got 3`},
		{"weights negative", ms(router(Rule{Name: "x", Use: []string{"a", "b"}, Weights: []int{-1, 5}})), `model "auto": rule "x": weights: must be from 0 to 4294967295, got -1`},
		{"weights all zero", ms(router(Rule{Name: "x", Use: []string{"a", "b"}, Weights: []int{0, 0}})), `model "auto": rule "x": weights: at least one must be positive`},
		{"match empty name", ms(router(catchAll, Rule{Name: "x", Use: []string{"a"}, Match: map[string]StringList{"": {"v"}}})), `model "auto": rule "x": match: an attribute name must not be empty`},
		{"match upper-case", ms(router(catchAll, Rule{Name: "x", Use: []string{"a"}, Match: map[string]StringList{"Language": {"es"}}})), `model "auto": rule "x": match "Language": attribute names are lower-case (headers are read lower-cased)`},
		{"match no value", ms(router(catchAll, Rule{Name: "x", Use: []string{"a"}, Match: map[string]StringList{"language": {}}})), `model "auto": rule "x": match "language": needs at least one value`},
		{"shadow unknown", ms(router(Rule{Name: "x", Use: []string{"a"}, Shadow: &Shadow{Model: "cand", Fraction: 0.1}})), `model "auto": rule "x": shadow: unknown model "cand"`},
		{"shadow router", ms(router(Rule{Name: "x", Use: []string{"a"}, Shadow: &Shadow{Model: "auto", Fraction: 0.1}})), `model "auto": rule "x": shadow: "auto" is a router model`},
		{"shadow fraction", ms(router(Rule{Name: "x", Use: []string{"a"}, Shadow: &Shadow{Model: "b", Fraction: 1.5}})), `model "auto": rule "x": shadow: fraction must be between 0 and 1, got 1.5`},
		{"no catch-all for high", ms(router(Rule{Name: "lo", Effort: "low", Use: []string{"a"}}, Rule{Name: "med", Effort: "medium", Use: []string{"a"}},
			Rule{Name: "es", Effort: "high", Use: []string{"a"}, Match: map[string]StringList{"language": {"es"}}})),
			`model "auto": no rule without match covers effort high: a high request could match no rule`},
		{"judge unknown", ms(Model{Name: "auto", Rules: []Rule{catchAll}, Judge: &Judge{Model: "clf"}}), `model "auto": judge: unknown model "clf"`},
		{"judge router", ms(Model{Name: "auto", Rules: []Rule{catchAll}, Judge: &Judge{Model: "auto"}}), `model "auto": judge: "auto" is a router model`},
		{"judge deadline", ms(Model{Name: "auto", Rules: []Rule{catchAll}, Judge: &Judge{Model: "a", Deadline: d("20s")}}), `model "auto": judge: deadline must be between 1ms and 10s`},
		{"router patch", ms(Model{Name: "auto", Rules: []Rule{catchAll}, Patch: json.RawMessage(`{"a":1}`)}), `model "auto": patch: a router model has none of its own; put it on the models in use`},
		{"suffix clash", ms(router(catchAll), plain("auto:high")), `model "auto:high": clashes with router model "auto" and its effort suffix`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateConfig(providers, upstreams, nil, tc.models)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v\nwant it to contain %q", err, tc.want)
			}
		})
	}
	// A plain model named like a suffix of no router is fine (Ollama's
	// qwen3:8b), and so is a complete rule set.
	ok := ms(plain("qwen3:8b"), router(Rule{Name: "es", Priority: 5, Effort: "high", Use: []string{"b", "a"}, Weights: []int{90, 10},
		Match: map[string]StringList{"language": {"es", "pt"}}}, catchAll))
	if err := validateConfig(providers, upstreams, nil, ok); err != nil {
		t.Fatalf("valid router model refused: %v", err)
	}
}

// TestStringListJSON: a match value decodes from a string or a list and
// encodes one value as a string.
func TestStringListJSON(t *testing.T) {
	var m map[string]StringList
	if err := json.Unmarshal([]byte(`{"a":"x","b":["y","z"]}`), &m); err != nil {
		t.Fatal(err)
	}
	if len(m["a"]) != 1 || m["a"][0] != "x" || len(m["b"]) != 2 {
		t.Fatalf("decoded %v", m)
	}
	b, _ := json.Marshal(m)
	if string(b) != `{"a":"x","b":["y","z"]}` {
		t.Fatalf("encoded %s", b)
	}
	if err := json.Unmarshal([]byte(`{"a":3}`), &m); err == nil || !strings.Contains(err.Error(), "want a string or a list of strings") {
		t.Fatalf("a number: %v", err)
	}
}

// TestEffortValues: the client values and their aliases, case-insensitive;
// anything else is no effort.
func TestEffortValues(t *testing.T) {
	for v, want := range map[string]effort{"low": effortLow, "Minimal": effortLow, "none": effortLow, "medium": effortMedium,
		"HIGH": effortHigh, "xhigh": effortHigh, "max": effortHigh, "extreme": effortNone, "": effortNone, "mediumish": effortNone} {
		if got := parseEffortValue([]byte(v)); got != want {
			t.Errorf("%q: got %v, want %v", v, got, want)
		}
	}
}
