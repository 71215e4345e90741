package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestValidDepth(t *testing.T) {
	for _, n := range []int{9999, 10000, 10001} {
		b := []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Errorf("depth %d: Valid=%v json.Valid=%v", n, got, want)
		}
	}
}

func TestEachMemberAndElem(t *testing.T) {
	b := []byte(` {"a" : [1, {"x":"}"}, "s\"q"], "k\u0065y":-1.5e3 ,"n":null}`)
	var keys, vals []string
	if !EachMember(b, 0, func(k []byte, vs, ve int) bool {
		keys = append(keys, string(k))
		vals = append(vals, string(b[vs:ve]))
		return true
	}) {
		t.Fatal("EachMember reported malformed input")
	}
	wantK := []string{"a", `k\u0065y`, "n"} // raw keys, escapes kept
	wantV := []string{`[1, {"x":"}"}, "s\"q"]`, "-1.5e3", "null"}
	if strings.Join(keys, "|") != strings.Join(wantK, "|") || strings.Join(vals, "|") != strings.Join(wantV, "|") {
		t.Fatalf("members = %q %q, want %q %q", keys, vals, wantK, wantV)
	}
	arr := []byte(vals[0])
	var elems []string
	if !EachElem(arr, 0, func(vs, ve int) bool { elems = append(elems, string(arr[vs:ve])); return true }) {
		t.Fatal("EachElem reported malformed input")
	}
	if got := strings.Join(elems, "|"); got != `1|{"x":"}"}|"s\"q"` {
		t.Fatalf("elements = %q", elems)
	}
	// Stopping early reports false; so does a truncated object.
	if EachMember(b, 0, func([]byte, int, int) bool { return false }) {
		t.Error("EachMember ignored fn's false")
	}
	if EachMember([]byte(`{"a":1,`), 0, func([]byte, int, int) bool { return true }) {
		t.Error("EachMember accepted a truncated object")
	}
	if !EachElem([]byte(` [ ]`), 0, func(int, int) bool { t.Error("element in []"); return true }) {
		t.Error("EachElem rejected []")
	}
}

func TestResumeArray(t *testing.T) {
	b := []byte(`[10, [2], "three" ,4]`)
	it := IterArray(b, 0, false)
	it.Next()
	second, _, _ := it.Next()
	var got []string
	for r := ResumeArray(b, second, false); ; {
		vs, ve, more := r.Next()
		if !more {
			if !r.OK() {
				t.Fatal("resumed walk failed")
			}
			break
		}
		got = append(got, string(b[vs:ve]))
	}
	if strings.Join(got, "|") != `[2]|"three"|4` {
		t.Fatalf("resumed elements = %q", got)
	}
}

func TestObjIterPos(t *testing.T) {
	b := []byte(`{"a":1 , "b":{} }  tail`)
	it := IterObject(b, 0, true)
	var m Member
	for it.Next(&m) {
	}
	if !it.OK() || string(b[:it.Pos()]) != `{"a":1 , "b":{} }` {
		t.Fatalf("OK=%v Pos=%d (%q)", it.OK(), it.Pos(), b[:it.Pos()])
	}
}

func TestParseUint(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "42": 42, "7.9": 7, "3e2": 3, "-1": 0, "x": 0, "": 0} {
		if got := ParseUint([]byte(in)); got != want {
			t.Errorf("ParseUint(%q) = %d, want %d", in, got, want)
		}
	}
}

// utf8Fixed replaces each invalid UTF-8 byte with U+FFFD, as encoding/json
// does when it decodes a string (AppendUnescape copies raw bytes as they are).
func utf8Fixed(b []byte) string { return string([]rune(string(b))) }

// FuzzScan checks the scanner against encoding/json: Valid agrees with
// json.Valid; on a valid object the members EachMember sees (keys decoded
// with AppendUnescape, values re-read by encoding/json) equal what
// json.Unmarshal sees; every string value decodes as json.Unmarshal decodes
// it and re-encodes with AppendQuoted into valid JSON with the same value.
func FuzzScan(f *testing.F) {
	f.Add([]byte(`{"a":1,"b":[true,false,null],"c":{"d":"e\u00e9\ud83d\ude00\n"}}`))
	f.Add([]byte(` { "k\"ey" : "v\\" , "x" : -0.5E+3 } `))
	f.Add([]byte(`{"lone":"\ud800x","bad":"\xff\xfe"}`))
	f.Add([]byte(`[1,2`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := Valid(b), json.Valid(b); got != want {
			t.Fatalf("Valid(%q) = %v, json.Valid = %v", b, got, want)
		}
		if !json.Valid(b) {
			// Fast mode on malformed input: must not panic or loop.
			EachMember(b, 0, func([]byte, int, int) bool { return true })
			EachElem(b, 0, func(int, int) bool { return true })
			return
		}
		var ref map[string]json.RawMessage
		if json.Unmarshal(b, &ref) != nil {
			return // not an object
		}
		seen := map[string]json.RawMessage{}
		if !EachMember(b, 0, func(k []byte, vs, ve int) bool {
			seen[utf8Fixed(AppendUnescape(nil, k))] = b[vs:ve] // last wins, as in encoding/json
			return true
		}) {
			t.Fatalf("EachMember failed on valid %q", b)
		}
		if len(seen) != len(ref) {
			t.Fatalf("EachMember saw %d keys, encoding/json %d", len(seen), len(ref))
		}
		for k, v := range seen {
			if !bytes.Equal(bytes.TrimSpace(ref[k]), v) {
				t.Fatalf("key %q: value %q, encoding/json %q", k, v, ref[k])
			}
			if !IsString(v) {
				continue
			}
			var want string
			if err := json.Unmarshal(v, &want); err != nil {
				t.Fatal(err)
			}
			if got := utf8Fixed(AppendStringValue(nil, v)); got != want {
				t.Fatalf("AppendStringValue(%q) = %q, want %q", v, got, want)
			}
			q := AppendQuoted(nil, want)
			var back string
			if err := json.Unmarshal(q, &back); err != nil || back != want {
				t.Fatalf("AppendQuoted(%q) = %q: %v, %q", want, q, err, back)
			}
		}
	})
}
