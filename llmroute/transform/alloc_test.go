package transform

import (
	"testing"
	"time"
)

// The hot paths must not allocate in steady state: a stream chunk that needs
// no change, a rewritten chunk, a request rewrite into a reused dst, and a
// session lookup.
func TestZeroAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("race detector allocates")
	}
	var n int
	s := NewStreamRewriter(ThinkSplit, func(ev []byte) error { n += len(ev); return nil })
	think := []byte(`data: {"choices":[{"index":0,"delta":{"content":"a<think>b</think>c\u003cthi"}}]}` + "\r\n\r\n")
	release := []byte(`data: {"choices":[{"index":0,"delta":{"content":"nk>x</think>y"}}]}` + "\r\n\r\n")
	s.Write(think)
	s.Write(release)
	half := len(benchChunk) / 2
	cases := map[string]func(){
		"passthrough": func() { s.Write(benchChunk) },
		"passthrough split write": func() {
			s.Write(benchChunk[:half])
			s.Write(benchChunk[half:])
		},
		"rewritten": func() {
			s.Write(think)
			s.Write(release)
		},
	}
	body := benchBody(1500)
	e := benchEdit(nil, true)
	dst := make([]byte, 0, 4096)
	cases["RewriteRequest"] = func() { dst, _ = RewriteRequest(dst[:0], body, e) }
	sess := NewSessions(10, time.Hour, nil)
	sess.ID(body)
	cases["Sessions.ID"] = func() { sess.ID(body) }
	for name, f := range cases {
		if a := testing.AllocsPerRun(50, f); a != 0 {
			t.Errorf("%s: %.1f allocs per run", name, a)
		}
	}
}
