package llmroute

import (
	"math"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestShadowStride: of the first n requests, exactly floor(n × fraction)
// are shadowed, spread evenly (0.25: every fourth).
func TestShadowStride(t *testing.T) {
	for _, f := range []float64{0.25, 0.1, 1.0 / 3, 0.7, 0.999, 1, 0.001} {
		sp := &shadowSpec{fraction: f}
		taken := 0
		for n := 1; n <= 1000; n++ {
			if sp.take() {
				taken++
				if f == 0.25 && n%4 != 0 {
					t.Fatalf("fraction 0.25: request %d shadowed, want every fourth only", n)
				}
			}
			if want := int(math.Floor(float64(n) * f)); taken != want {
				t.Fatalf("fraction %v: %d of the first %d shadowed, want %d", f, taken, n, want)
			}
		}
	}
}

// TestShadowMainAnswer: the client's last attempt is its answer; a
// refusal after failovers is the proxy's; an answer never reported as
// ended (an attempt aborted it) is "interrupted"; the line is written
// once, by the second answer to end, and only for a copy that was sent.
func TestShadowMainAnswer(t *testing.T) {
	u := &upstream{}
	u.ID = "u1"
	tg := &target{up: u, model: "m"}
	first := time.Now()
	core, logs := observer.New(zapcore.InfoLevel)
	newRun := func() *shadowRun {
		return &shadowRun{c: &shadowCopy{h: &Handler{logger: zap.New(core)}, start: first.Add(-time.Second)}}
	}

	sr := newRun()
	sr.mainAnswer(tg, &attemptResult{out: outFailover, result: result5xx, status: 503})
	sr.mainAnswer(tg, &attemptResult{out: outDone, result: resultOK, status: 200, firstByte: first})
	sr.mainEnded()
	if logs.Len() != 0 {
		t.Fatalf("a line before the copy ended")
	}
	sr.shadowEnded(shadowAnswer{model: "cand", result: resultOK, status: 200, end: first, sent: true})
	sr.mainEnded() // once only
	if m := sr.sums[0]; m.result != resultOK || m.status != 200 || m.upstream != "u1" || m.model != "m" || !m.firstByte.Equal(first) {
		t.Errorf("served: %+v", m)
	}
	if lines := logs.TakeAll(); len(lines) != 1 || lines[0].Message != "shadow compared" ||
		lines[0].ContextMap()["main_ttft"] != time.Second || lines[0].ContextMap()["same_status"] != true {
		t.Errorf("lines: %+v", lines)
	}

	sr = newRun()
	sr.shadowEnded(shadowAnswer{model: "cand", result: result5xx, status: 500, end: first, sent: true})
	sr.mainAnswer(tg, &attemptResult{out: outFailover, result: result5xx, status: 503})
	sr.mainRefused(errAllFailed)
	sr.mainEnded()
	if m := sr.sums[0]; m.result != errAllFailed.code || m.status != errAllFailed.status || m.usage.Seen {
		t.Errorf("refused: %+v", m)
	}
	// The client's side came second: the line is written off its goroutine.
	for end := time.Now().Add(5 * time.Second); logs.Len() == 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if lines := logs.TakeAll(); len(lines) != 1 || lines[0].ContextMap()["main_result"] != errAllFailed.code {
		t.Errorf("lines: %+v", lines)
	}

	sr = newRun()
	sr.mainAnswer(tg, &attemptResult{out: outFailover, result: result5xx, status: 503})
	sr.mainEnded()
	sr.shadowEnded(shadowAnswer{}) // not sent
	if m := sr.sums[0]; m.result != "interrupted" || m.status != 0 || m.upstream != "" {
		t.Errorf("interrupted: %+v", m)
	}
	if logs.Len() != 0 {
		t.Errorf("a line for a copy never sent")
	}
}
