package transform

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	cases := []struct {
		body   string
		model  string
		stream bool
		err    error
	}{
		{`{"model":"gpt-4o","messages":[]}`, "gpt-4o", false, nil},
		{` {"stream":true,"model":"m"} `, "m", true, nil},
		{`{"model":"m","stream":"true"}`, "m", false, nil},
		{`{"model":"m","stream":1}`, "m", false, nil},
		{`{"model":"m","stream":true,"stream":false}`, "", false, ErrDuplicateKey},
		{`{"model":"a","model":"b"}`, "", false, ErrDuplicateKey},
		{`{"model":"a","mod\u0065l":"b"}`, "", false, ErrDuplicateKey},
		{`{"model":"a","messages":[],"x":1,"messages":[]}`, "", false, ErrDuplicateKey},
		{`{"model":"a","temperature":1,"temperature":2}`, "a", false, nil}, // not read, not watched here
		{`{"mod\u0065l":"\u00e9\n"}`, "é\n", false, nil},
		{`{"model":"x","nested":{"model":1,"stream":true}}`, "x", false, nil},
		{`{"messages":[]}`, "", false, ErrNoModel},
		{`{"model":null}`, "", false, ErrNoModel},
		{`{"model":42,"stream":true}`, "", true, ErrNoModel},
		{`{"model":{"x":"y"}}`, "", false, ErrNoModel},
		{``, "", false, ErrBadJSON},
		{`   `, "", false, ErrBadJSON},
		{`[]`, "", false, ErrBadJSON},
		{`"model"`, "", false, ErrBadJSON},
		{`null`, "", false, ErrBadJSON},
		{`{"model":"m"`, "", false, ErrBadJSON},
		{`{"model":"m"}}`, "", false, ErrBadJSON},
		{`{"model":"m"} {}`, "", false, ErrBadJSON},
		{`{"model":"m",}`, "", false, ErrBadJSON},
		{`{"model":"m","x":01}`, "", false, ErrBadJSON},
		{`{"model":"m","x":1.}`, "", false, ErrBadJSON},
		{`{"model":"m","x":"\x01"}`, "", false, ErrBadJSON},
		{`{"model":"m","x":"\q"}`, "", false, ErrBadJSON},
		{`{"model":"m","x":"\u12G4"}`, "", false, ErrBadJSON},
		{`{"model":"m","x":tru}`, "", false, ErrBadJSON},
		{"\ufeff{\"model\":\"m\"}", "", false, ErrBadJSON},
		{`{'model':'m'}`, "", false, ErrBadJSON},
	}
	for _, c := range cases {
		model, stream, err := ParseRequest([]byte(c.body))
		if err != c.err || model != c.model || (err != ErrBadJSON && stream != c.stream) {
			t.Errorf("ParseRequest(%q) = %q, %v, %v; want %q, %v, %v", c.body, model, stream, err, c.model, c.stream, c.err)
		}
		isObj := strings.HasPrefix(strings.TrimLeft(c.body, " \t\r\n"), "{")
		if (err != ErrBadJSON) != (isObj && json.Valid([]byte(c.body))) {
			t.Errorf("ParseRequest(%q) disagrees with json.Valid", c.body)
		}
	}
}

// TestParseRequestKeys: watched keys report their duplicates as bits, in
// the same pass, and unwatched duplicates are ignored.
func TestParseRequestKeys(t *testing.T) {
	watch := []string{"temperature", "provider", "max_tokens"}
	cases := []struct {
		body string
		dups uint64
	}{
		{`{"model":"m","temperature":1,"provider":{}}`, 0},
		{`{"model":"m","temperature":1,"temperature":2}`, 1},
		{`{"model":"m","provider":{},"x":1,"provider":[],"max_tokens":1,"max_tokens":2}`, 2 | 4},
		{`{"model":"m","tempera\u0074ure":1,"temperature":2}`, 1},
		{`{"model":"m","top_p":1,"top_p":2}`, 0},
		{`{"model":"m","nested":{"temperature":1,"temperature":2}}`, 0},
	}
	for _, c := range cases {
		model, _, dups, err := ParseRequestKeys([]byte(c.body), watch, nil)
		if err != nil || model != "m" || dups != c.dups {
			t.Errorf("ParseRequestKeys(%s) = %q, %b, %v; want m, %b", c.body, model, dups, err, c.dups)
		}
	}
	// Past 63 watched keys bits are shared: a duplicate is never missed.
	many := make([]string, 70)
	for i := range many {
		many[i] = fmt.Sprintf("k%d", i)
	}
	if _, _, dups, _ := ParseRequestKeys([]byte(`{"model":"m","k69":1,"k69":2}`), many, nil); dups&(1<<63) == 0 {
		t.Errorf("duplicate of the 70th watched key missed: %b", dups)
	}
}

func TestRewriteRequestModel(t *testing.T) {
	cases := []struct {
		name, body, model, patch, want string
	}{
		{"swap", `{"model":"a","x":1}`, "b", "", `{"model":"b","x":1}`},
		{"swap escaped", `{"model":"a"}`, "q\"u\\o\nté", "", `{"model":"q\"u\\o\nté"}`},
		{"swap keeps spacing", "{ \"model\" :\t\"a\" , \"x\":1 }", "b", "", "{ \"model\" :\t\"b\" , \"x\":1 }"},
		{"swap last duplicate", `{"model":"a","model":"c"}`, "b", "", `{"model":"a","model":"b"}`},
		{"swap escaped key", `{"m\u006fdel":"a"}`, "b", "", `{"m\u006fdel":"b"}`},
		{"no model key appended", `{"x":1}`, "b", "", `{"x":1,"model":"b"}`},
		{"empty model leaves", `{"model":"a"}`, "", `{"x":1}`, `{"model":"a","x":1}`},
		{"patch model wins", `{"model":"a"}`, "b", `{"model":"p"}`, `{"model":"p"}`},
		{"patch merge into model string", `{"model":"a"}`, "b", `{"model":{"k":1}}`, `{"model":{"k":1}}`},
		{"patch and swap", `{"model":"a","p":{"q":1}}`, "b", `{"p":{"r":2}}`, `{"model":"b","p":{"q":1,"r":2}}`},
		{"surrounding whitespace", "\n {\"model\":\"a\"} \n", "b", "", "\n {\"model\":\"b\"} \n"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &RequestEdit{Model: c.model, Patch: mustPatch(t, c.patch)}
			got, err := RewriteRequest([]byte("dst:"), []byte(c.body), e)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "dst:"+c.want {
				t.Fatalf("got  %q\nwant %q", got, "dst:"+c.want)
			}
		})
	}
	// nil edit copies.
	got, _ := RewriteRequest(nil, []byte(`{"model":"a"}`), nil)
	if string(got) != `{"model":"a"}` {
		t.Fatal(string(got))
	}
	if _, err := RewriteRequest(nil, []byte(`[1]`), &RequestEdit{Model: "x"}); err != ErrBadJSON {
		t.Fatalf("non-object: %v", err)
	}
}

func TestBackfillOpenRouterHistory(t *testing.T) {
	body, err := os.ReadFile("testdata/openrouter_history.json")
	if err != nil {
		t.Fatal(err)
	}
	src := string(body)
	repl := func(s, old, new string) string {
		t.Helper()
		if strings.Count(s, old) != 1 {
			t.Fatalf("fixture anchor %q not unique", old)
		}
		return strings.Replace(s, old, new, 1)
	}
	// Expected: the exact input plus the backfilled values, nothing else.
	want := src
	want = repl(want, `"arguments": "{\"path\":\".\"}"}}
      ]`, `"arguments": "{\"path\":\".\"}"}}
      ],"reasoning_content":"The user wants a listing.\nI'll call the ls tool."`)
	want = repl(want, `{"text": "Answer \"briefly\" \u2014 ok."}
      ]`, `{"text": "Answer \"briefly\" \u2014 ok."}
      ],"reasoning_content":"Three entries.\nAnswer \"briefly\" \u2014 ok."`)
	want = repl(want, `"reasoning_content": null, "reasoning": "from reasoning"`, `"reasoning_content": "from reasoning", "reasoning": "from reasoning"`)
	want = repl(want, `"model": "deepseek-chat-thinking"`, `"model": "deepseek-v4"`)

	e := &RequestEdit{Model: "deepseek-v4", ReasoningField: "reasoning_content"}
	got, err := RewriteRequest(nil, body, e)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}

	// reasoning_empty_ok: the message without any reasoning gets "".
	e.ReasoningEmptyOK = true
	want = repl(want, `{"role": "assistant", "content": "No reasoning at all."}`, `{"role": "assistant", "content": "No reasoning at all.","reasoning_content":""}`)
	got, _ = RewriteRequest(nil, body, e)
	if string(got) != want {
		t.Fatalf("empty_ok got:\n%s\nwant:\n%s", got, want)
	}
	// Decoded view: every assistant message now has a string field, users untouched.
	var req struct {
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(got, &req); err != nil {
		t.Fatal(err)
	}
	for i, m := range req.Messages {
		_, has := m["reasoning_content"].(string)
		if (m["role"] == "assistant") != has {
			t.Errorf("message %d (%v): reasoning_content present=%v", i, m["role"], has)
		}
	}
	if rc := req.Messages[4]["reasoning_content"]; rc != "Three entries.\nAnswer \"briefly\" — ok." {
		t.Errorf("joined details decoded = %q", rc)
	}
}

func TestBackfillCases(t *testing.T) {
	cases := []struct {
		name, msgs string
		emptyOK    bool
		want       string
	}{
		{"reasoning string", `[{"role":"assistant","reasoning":"r"}]`, false, `[{"role":"assistant","reasoning":"r","rc":"r"}]`},
		{"reasoning wins over details", `[{"role":"assistant","reasoning_details":[{"text":"d"}],"reasoning":"r"}]`, false, `[{"role":"assistant","reasoning_details":[{"text":"d"}],"reasoning":"r","rc":"r"}]`},
		{"empty reasoning falls back to details", `[{"role":"assistant","reasoning":"","reasoning_details":[{"type":"reasoning.text","text":"a"},{"type":null,"text":"b"}]}]`, false, `[{"role":"assistant","reasoning":"","reasoning_details":[{"type":"reasoning.text","text":"a"},{"type":null,"text":"b"}],"rc":"a\nb"}]`},
		{"non-string reasoning ignored", `[{"role":"assistant","reasoning":{"x":1}}]`, false, `[{"role":"assistant","reasoning":{"x":1}}]`},
		{"details other types skipped", `[{"role":"assistant","reasoning_details":[{"type":"reasoning.summary","text":"s"},{"type":"reasoning.text","text":7}]}]`, false, `[{"role":"assistant","reasoning_details":[{"type":"reasoning.summary","text":"s"},{"type":"reasoning.text","text":7}]}]`},
		{"empty texts join", `[{"role":"assistant","reasoning_details":[{"text":""},{"text":""}]}]`, false, `[{"role":"assistant","reasoning_details":[{"text":""},{"text":""}],"rc":"\n"}]`},
		{"single empty text is no text", `[{"role":"assistant","reasoning_details":[{"text":""}]}]`, false, `[{"role":"assistant","reasoning_details":[{"text":""}]}]`},
		{"existing non-empty kept", `[{"role":"assistant","rc":"x","reasoning":"r"}]`, false, `[{"role":"assistant","rc":"x","reasoning":"r"}]`},
		{"existing empty replaced in place", `[{"rc":"","role":"assistant","reasoning":"r"}]`, false, `[{"rc":"r","role":"assistant","reasoning":"r"}]`},
		{"existing number replaced", `[{"role":"assistant","rc":0,"reasoning":"r"}]`, false, `[{"role":"assistant","rc":"r","reasoning":"r"}]`},
		{"null no text left", `[{"role":"assistant","rc":null}]`, false, `[{"role":"assistant","rc":null}]`},
		{"null no text empty_ok", `[{"role":"assistant","rc":null}]`, true, `[{"role":"assistant","rc":""}]`},
		{"empty no text empty_ok", `[{"role":"assistant","rc":""}]`, true, `[{"role":"assistant","rc":""}]`},
		{"absent empty_ok", `[{"role":"assistant"}]`, true, `[{"role":"assistant","rc":""}]`},
		{"other roles untouched", `[{"role":"user","reasoning":"r"},{"role":"tool","reasoning":"r"},{"role":"system","reasoning":"r"}]`, true, `[{"role":"user","reasoning":"r"},{"role":"tool","reasoning":"r"},{"role":"system","reasoning":"r"}]`},
		{"escaped role", `[{"role":"\u0061ssistant","reasoning":"r"}]`, false, `[{"role":"\u0061ssistant","reasoning":"r","rc":"r"}]`},
		{"escaped reasoning kept raw", `[{"role":"assistant","reasoning":"\u003cq\u003e\n"}]`, false, `[{"role":"assistant","reasoning":"\u003cq\u003e\n","rc":"\u003cq\u003e\n"}]`},
		{"non-object messages", `["x",1,null,{"role":"assistant","reasoning":"r"}]`, false, `["x",1,null,{"role":"assistant","reasoning":"r","rc":"r"}]`},
		{"spaced", "[ { \"role\" : \"assistant\" , \"reasoning\" : \"r\" } ]", false, "[ { \"role\" : \"assistant\" , \"reasoning\" : \"r\",\"rc\":\"r\" } ]"},
		{"no role", `[{"reasoning":"r"}]`, true, `[{"reasoning":"r"}]`},
		{"messages not array", `{"role":"assistant"}`, true, `{"role":"assistant"}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := &RequestEdit{ReasoningField: "rc", ReasoningEmptyOK: c.emptyOK}
			body := `{"model":"m","messages":` + c.msgs + `}`
			got, err := RewriteRequest(nil, []byte(body), e)
			if err != nil {
				t.Fatal(err)
			}
			want := `{"model":"m","messages":` + c.want + `}`
			if string(got) != want {
				t.Fatalf("got  %s\nwant %s", got, want)
			}
			if !json.Valid(got) {
				t.Fatal("invalid JSON")
			}
		})
	}
}

func TestBackfillSeesPatchedBody(t *testing.T) {
	// The patch replaces "messages": the backfill must apply to the patched
	// value (two-pass path).
	p := mustPatch(t, `{"messages":[{"role":"assistant","reasoning":"from patch"}]}`)
	e := &RequestEdit{Model: "x", Patch: p, ReasoningField: "reasoning_content"}
	got, err := RewriteRequest(nil, []byte(` {"model":"a","messages":[{"role":"user","content":"hi"}]} `), e)
	if err != nil {
		t.Fatal(err)
	}
	want := ` {"model":"x","messages":[{"role":"assistant","reasoning":"from patch","reasoning_content":"from patch"}]} `
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// Backfill and patch in one pass: the patch adds a key, backfill edits messages.
	p = mustPatch(t, `{"provider":{"sort":"price"}}`)
	e = &RequestEdit{Model: "x", Patch: p, ReasoningField: "reasoning_content"}
	got, _ = RewriteRequest(nil, []byte(`{"messages":[{"role":"assistant","reasoning":"r"}],"model":"a"}`), e)
	want = `{"messages":[{"role":"assistant","reasoning":"r","reasoning_content":"r"}],"model":"x","provider":{"sort":"price"}}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// The members a Spans names are noted in the same pass, escaped keys
// included; an absent one stays 0, 0.
func TestParseRequestKeysSpans(t *testing.T) {
	body := []byte(`{"model":"m","sys\u0074em":"be brief","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	sp := Spans{Names: [8]string{"system", "messages", "tools"}}
	if _, _, _, err := ParseRequestKeys(body, nil, &sp); err != nil {
		t.Fatal(err)
	}
	got := func(i int) string { return string(body[sp.At[i][0]:sp.At[i][1]]) }
	if got(0) != `"be brief"` || got(1) != `[{"role":"user","content":"hi"}]` || sp.At[2] != [2]int{} {
		t.Errorf("spans %q %q %v", got(0), got(1), sp.At[2])
	}
}

// All eight slots are noted (the last four are a router model's effort,
// budget, user and metadata), in one pass that allocates only the model.
func TestParseRequestKeysEightSpans(t *testing.T) {
	body := []byte(`{"model":"auto","system":"s","messages":[],"tools":[],"metadata":{"team":"x"},` +
		`"output_config":{"effort":"high"},"thinking":{"budget_tokens":9},"user":"u-1","stream":false}`)
	sp := Spans{Names: [8]string{"system", "messages", "tools", "metadata", "output_config", "thinking", "user", "metadata"}}
	want := []string{`"s"`, `[]`, `[]`, `{"team":"x"}`, `{"effort":"high"}`, `{"budget_tokens":9}`, `"u-1"`, `{"team":"x"}`}
	allocs := testing.AllocsPerRun(50, func() {
		sp.At = [8][2]int{}
		if _, _, _, err := ParseRequestKeys(body, nil, &sp); err != nil {
			t.Fatal(err)
		}
	})
	for i, w := range want {
		if got := string(body[sp.At[i][0]:sp.At[i][1]]); got != w {
			t.Errorf("slot %d = %s, want %s", i, got, w)
		}
	}
	if allocs > 1 && !raceEnabled {
		t.Errorf("%v allocations per parse, want 1 (the model)", allocs)
	}
}
