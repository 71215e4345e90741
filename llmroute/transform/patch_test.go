package transform

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

func mustPatch(t testing.TB, s string) *Patch {
	t.Helper()
	p, err := CompilePatch([]byte(s))
	if err != nil {
		t.Fatalf("CompilePatch(%s): %v", s, err)
	}
	return p
}

func TestSpecWorkedExample(t *testing.T) {
	client := `{"model":"my-gpt","messages":[{"role":"user","content":"привет"}],"temperature":0.7}`
	provider := mustPatch(t, `{"provider":{"allow_fallbacks":false}}`)
	upstream := mustPatch(t, `{"provider":{"ignore":["deepseek"]}}`)
	model := mustPatch(t, `{"reasoning":{"enabled":false}}`)
	e := &RequestEdit{Model: "gpt-4o", Patch: provider.Then(upstream).Then(model)}
	got, err := RewriteRequest(nil, []byte(client), e)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"gpt-4o","messages":[{"role":"user","content":"привет"}],"temperature":0.7,"provider":{"allow_fallbacks":false,"ignore":["deepseek"]},"reasoning":{"enabled":false}}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	// The local-qwen fallback of the reference: only the model patch applies.
	e = &RequestEdit{Model: "qwen2.5-72b-instruct", Patch: model}
	got, _ = RewriteRequest(nil, []byte(client), e)
	want = `{"model":"qwen2.5-72b-instruct","messages":[{"role":"user","content":"привет"}],"temperature":0.7,"reasoning":{"enabled":false}}`
	if string(got) != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

func TestCompilePatch(t *testing.T) {
	for _, s := range []string{"", "  ", "null", " null ", "{}", " { } "} {
		p, err := CompilePatch([]byte(s))
		if err != nil || p != nil {
			t.Errorf("CompilePatch(%q) = %v, %v; want nil, nil", s, p, err)
		}
	}
	for _, s := range []string{"[]", "1", `"x"`, "true", "{", `{"a":}`, `{"a":1}x`} {
		if p, err := CompilePatch([]byte(s)); err == nil {
			t.Errorf("CompilePatch(%q) = %v, nil; want error", s, p)
		}
	}
	p := mustPatch(t, `{ "a" : [ 1 , 2 ], "b": { "c" : null } }`)
	if p.Empty() {
		t.Fatal("Empty() on non-empty patch")
	}
	var nilP *Patch
	if !nilP.Empty() {
		t.Fatal("nil patch not Empty")
	}
	got, _ := p.Apply(nil, []byte(`{}`))
	if string(got) != `{"a":[1,2],"b":{"c":null}}` {
		t.Fatalf("values not compacted: %s", got)
	}
	// Duplicate patch keys: last wins, at the first one's place.
	p = mustPatch(t, `{"a":{"x":1},"b":2,"a":{"y":2}}`)
	got, _ = p.Apply(nil, []byte(`{"a":{"z":0}}`))
	if string(got) != `{"a":{"z":0,"y":2},"b":2}` {
		t.Fatalf("duplicate patch keys: %s", got)
	}
}

func TestPatchApply(t *testing.T) {
	cases := []struct {
		name, body, patch, want string
	}{
		{"append to empty", `{}`, `{"a":1}`, `{"a":1}`},
		{"append to empty spaced", `{ }`, `{"a":1,"b":2}`, `{"a":1,"b":2 }`},
		{"replace scalar in place", `{"a":1,"b":2}`, `{"a":"x"}`, `{"a":"x","b":2}`},
		{"array replaces array", `{"a":[1,2,3]}`, `{"a":[9]}`, `{"a":[9]}`},
		{"null replaces", `{"a":{"b":1}}`, `{"a":null}`, `{"a":null}`},
		{"object replaces scalar", `{"a":5}`, `{"a":{"b":1}}`, `{"a":{"b":1}}`},
		{"object replaces array", `{"a":[1]}`, `{"a":{"b":{"c":1}}}`, `{"a":{"b":{"c":1}}}`},
		{"nested merge", `{"a":{"b":{"c":1,"d":2},"e":3}}`, `{"a":{"b":{"d":20,"f":4}}}`, `{"a":{"b":{"c":1,"d":20,"f":4},"e":3}}`},
		{"empty patch object keeps object", `{"a":{"b":1}}`, `{"a":{}}`, `{"a":{"b":1}}`},
		{"empty patch object replaces scalar", `{"a":1}`, `{"a":{}}`, `{"a":{}}`},
		{"escaped body key", `{"mod\u0065l":"x","n":1}`, `{"model":"y"}`, `{"mod\u0065l":"y","n":1}`},
		{"escaped patch key", `{"model":"x"}`, `{"mod\u0065l":"y","\u00e9":1}`, `{"model":"y","\u00e9":1}`},
		{"invalid UTF-8 key kept as written", `{}`, "{\"\xf6\":{\"a\":1}}", "{\"\xf6\":{\"a\":1}}"},
		{"duplicate body keys: last changed", `{"a":1,"a":2}`, `{"a":3}`, `{"a":1,"a":3}`},
		{"whitespace kept", "{\n  \"a\" : 1 ,\n  \"b\":\t{ \"c\" : 2 }\n}\n", `{"b":{"d":3},"e":4}`, "{\n  \"a\" : 1 ,\n  \"b\":\t{ \"c\" : 2,\"d\":3 },\"e\":4\n}\n"},
		{"numbers untouched", `{"t":1.50,"n":1e+03,"big":123456789012345678901234567890}`, `{"x":true}`, `{"t":1.50,"n":1e+03,"big":123456789012345678901234567890,"x":true}`},
		{"key order kept", `{"z":1,"y":{"b":1,"a":2},"x":3}`, `{"y":{"a":0,"c":5},"w":1}`, `{"z":1,"y":{"b":1,"a":0,"c":5},"x":3,"w":1}`},
		{"unicode and escapes untouched", `{"s":"\u003cthink\u003e \"q\" привет","a":1}`, `{"a":2}`, `{"s":"\u003cthink\u003e \"q\" привет","a":2}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := mustPatch(t, c.patch)
			got, err := p.Apply(nil, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Fatalf("got  %q\nwant %q", got, c.want)
			}
			if !json.Valid(got) {
				t.Fatalf("invalid JSON %s", got)
			}
			checkRef(t, []byte(c.body), got, c.patch)
		})
	}
}

// checkRef compares a raw patch result with the map-merge reference.
func checkRef(t testing.TB, body, got []byte, patches ...string) {
	t.Helper()
	ref, err := decodeAny(body)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range patches {
		pv, err := decodeAny([]byte(p))
		if err != nil {
			t.Fatal(err)
		}
		refMerge(ref.(map[string]any), pv.(map[string]any))
	}
	if want := string(mustJSON(ref)); normJSON(t, got) != want {
		t.Fatalf("reference mismatch\ngot  %s\nwant %s", normJSON(t, got), want)
	}
}

func TestPatchThenNonAssociative(t *testing.T) {
	bodies := []string{
		`{}`,
		`{"a":{"keep":1,"b":{"c":1}}}`,
		`{"a":"scalar"}`,
		`{"a":[1,2]}`,
		`{"a":null,"z":0}`,
		`{"a":{"b":5}}`,
	}
	pairs := [][2]string{
		// p sets a scalar, q merges an object: q's object must replace the
		// scalar wholesale, not merge into the body's object.
		{`{"a":1}`, `{"a":{"b":{"c":2}}}`},
		{`{"a":[1]}`, `{"a":{"x":1}}`},
		{`{"a":null}`, `{"a":{}}`},
		// p sets an object, q merges into it.
		{`{"a":{"b":1}}`, `{"a":{"c":2}}`},
		// Merge then set.
		{`{"a":{"b":{"c":1}}}`, `{"a":{"b":7}}`},
		{`{"a":{"b":{"c":1}}}`, `{"a":3}`},
		// Merge then merge, deep.
		{`{"a":{"b":{"c":1}},"x":1}`, `{"a":{"b":{"d":2}},"y":2}`},
		// Set object then merge deeper.
		{`{"a":{"b":"s"}}`, `{"a":{"b":{"c":1}}}`},
		{`{"p":1,"q":2}`, `{"q":{"r":1},"p":{"s":2},"n":3}`},
	}
	for _, pr := range pairs {
		p, q := mustPatch(t, pr[0]), mustPatch(t, pr[1])
		pq := p.Then(q)
		for _, b := range bodies {
			seq1, err := p.Apply(nil, []byte(b))
			if err != nil {
				t.Fatal(err)
			}
			seq, _ := q.Apply(nil, seq1)
			one, _ := pq.Apply(nil, []byte(b))
			if string(seq) != string(one) {
				t.Errorf("p=%s q=%s body=%s:\nsequential %s\nThen       %s", pr[0], pr[1], b, seq, one)
			}
			checkRef(t, []byte(b), one, pr[0], pr[1])
		}
	}
	// The specific failure of a naive "merge the patches" composition.
	p, q := mustPatch(t, `{"a":1}`), mustPatch(t, `{"a":{"b":2}}`)
	got, _ := p.Then(q).Apply(nil, []byte(`{"a":{"keep":true}}`))
	if string(got) != `{"a":{"b":2}}` {
		t.Fatalf("Then not sequential: %s", got)
	}
}

func TestPatchThenNil(t *testing.T) {
	p := mustPatch(t, `{"a":1}`)
	var n *Patch
	if n.Then(p) != p || p.Then(n) != p || n.Then(n) != nil {
		t.Fatal("nil Then")
	}
	// Inputs are not modified.
	q := mustPatch(t, `{"a":{"b":1}}`)
	_ = p.Then(q)
	got, _ := p.Apply(nil, []byte(`{}`))
	if string(got) != `{"a":1}` {
		t.Fatalf("p modified: %s", got)
	}
}

func TestPatchApplyErrors(t *testing.T) {
	p := mustPatch(t, `{"a":1}`)
	for _, b := range []string{``, `[]`, `"x"`, `{"a":`, `{"a":1`, `{"a" 1}`} {
		if _, err := p.Apply(nil, []byte(b)); err == nil {
			t.Errorf("Apply(%q) succeeded", b)
		}
	}
	// dst prefix preserved.
	got, err := p.Apply([]byte("PRE"), []byte(` {} `))
	if err != nil || string(got) != `PRE {"a":1} ` {
		t.Fatalf("got %q, %v", got, err)
	}
}

func TestPatchLarge(t *testing.T) {
	// More operations than the on-stack slot buffer.
	var sb strings.Builder
	sb.WriteString("{")
	for i := 0; i < 40; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `"k%d":{"v":1}`, i)
	}
	sb.WriteString("}")
	p := mustPatch(t, sb.String())
	body := `{"k1":{"w":2},"k39":3,"other":true}`
	got, err := p.Apply(nil, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	checkRef(t, []byte(body), got, sb.String())
}
