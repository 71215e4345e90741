package integration

// Helpers for the fault tests (faults_test.go) and the fault soak
// (soak_test.go): upstream behaviours that break in the ways real providers
// do, and client-side readers that tell a clean end of a response from an
// aborted one.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// faultRead reads a whole response body and returns it with the error that
// ended it: nil for a clean end (EOF after a complete body), otherwise what
// the client saw (io.ErrUnexpectedEOF for a chunked body cut short).
func faultRead(resp *http.Response) (string, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// faultEvents builds n chunk events with distinct content, without [DONE].
func faultEvents(n int, tag string) []string {
	events := make([]string, n)
	for i := range events {
		events[i] = fmt.Sprintf(`data: {"id":"chatcmpl-%s","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{"content":"%s-%d "},"finish_reason":null}]}`+"\n\n", tag, tag, i)
	}
	return events
}

// faultKeepalive is the proxy's heartbeat comment.
const faultKeepalive = ": keepalive\n\n"

// faultStripKeepalives removes the proxy's heartbeat comments from an SSE
// body and returns the rest and how many there were. Every heartbeat must
// sit between two events: at the very start or right after a blank line;
// one inside an event fails the test.
func faultStripKeepalives(t testing.TB, body string) (string, int) {
	t.Helper()
	var out strings.Builder
	n := 0
	rest := body
	for {
		i := strings.Index(rest, faultKeepalive)
		if i < 0 {
			out.WriteString(rest)
			return out.String(), n
		}
		before := out.String() + rest[:i]
		if before != "" && !strings.HasSuffix(before, "\n\n") && !strings.HasSuffix(before, "\r\r") &&
			!strings.HasSuffix(before, "\r\n\r\n") {
			t.Errorf("heartbeat inside an event, after %q", tail(before, 80))
		}
		out.WriteString(rest[:i])
		rest = rest[i+len(faultKeepalive):]
		n++
	}
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// faultStreamError is the payload of the proxy's final SSE error event.
type faultStreamError struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// faultSplitErrorEvent checks that body ends with exactly one well-formed
// final error event (`data: {"error":{…"type":"upstream_error","code":…}}`),
// starting at an event boundary, and returns what came before it and the
// code. ok is false (with a reason) when the body does not end that way.
func faultSplitErrorEvent(body string) (before, code string, err error) {
	i := strings.LastIndex(body, `data: {"error":`)
	if i < 0 {
		return "", "", fmt.Errorf("no error event at the end of %q", tail(body, 200))
	}
	before, ev := body[:i], body[i:]
	if before != "" && !strings.HasSuffix(before, "\n\n") && !strings.HasSuffix(before, "\r\r") &&
		!strings.HasSuffix(before, "\r\n\r\n") {
		return "", "", fmt.Errorf("error event does not start at an event boundary: %q", tail(body, 200))
	}
	payload, ok := strings.CutSuffix(strings.TrimPrefix(ev, "data: "), "\n\n")
	if !ok || strings.ContainsAny(payload, "\r\n") {
		return "", "", fmt.Errorf("error event is not one data line ending the body: %q", ev)
	}
	var se faultStreamError
	var raw map[string]map[string]any
	if err := json.Unmarshal([]byte(payload), &raw); err != nil || len(raw) != 1 || len(raw["error"]) != 3 {
		return "", "", fmt.Errorf("error event is not {\"error\":{message,type,code}}: %q", payload)
	}
	_ = json.Unmarshal([]byte(payload), &se)
	if se.Error.Type != "upstream_error" || se.Error.Message == "" || se.Error.Code == "" {
		return "", "", fmt.Errorf("error event fields: %q", payload)
	}
	for _, leak := range leakMarkers {
		if strings.Contains(payload, leak) {
			return "", "", fmt.Errorf("error event leaks %q: %q", leak, payload)
		}
	}
	return before, se.Error.Code, nil
}

// faultAbortedWith checks the body of a stream the proxy cut after it
// started: the events in want came through byte for byte (heartbeats
// aside), then the final error event with code, and the transfer ended
// abnormally (readErr is not nil: not a clean EOF).
func faultAbortedWith(t testing.TB, body string, readErr error, want, code string) {
	t.Helper()
	if readErr == nil {
		t.Errorf("the body ended with a clean EOF; an aborted transfer was expected (body %q)", tail(body, 300))
	}
	body, _ = faultStripKeepalives(t, body)
	before, got, err := faultSplitErrorEvent(body)
	if err != nil {
		t.Fatal(err)
	}
	if got != code {
		t.Errorf("error event code = %q, want %q", got, code)
	}
	if before != want {
		t.Errorf("events before the error event\n got %q\nwant %q", before, want)
	}
}

// faultHijack takes over the connection of an upstream response; the
// request body has been read already (newUpstream reads it).
func faultHijack(w http.ResponseWriter) (net.Conn, *bufio.ReadWriter) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(fmt.Sprintf("hijack: %v", err))
	}
	return conn, brw
}

// faultReset closes a connection with a TCP RST.
func faultReset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

// faultChunkedCut answers with a chunked SSE response carrying events and
// then closes the connection (FIN, no RST) without the terminating chunk:
// the proxy reads an unexpected EOF.
func faultChunkedCut(events []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		conn, brw := faultHijack(w)
		defer conn.Close()
		writeRawChunked(brw, events)
	}
}

// writeRawChunked writes a 200 chunked SSE response head (with the headers
// in hdr) and one chunk per event, flushed, without the last chunk.
func writeRawChunked(brw *bufio.ReadWriter, events []string, hdr ...string) {
	_, _ = brw.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n")
	for i := 0; i+1 < len(hdr); i += 2 {
		fmt.Fprintf(brw, "%s: %s\r\n", hdr[i], hdr[i+1])
	}
	_, _ = brw.WriteString("\r\n")
	for _, ev := range events {
		fmt.Fprintf(brw, "%x\r\n%s\r\n", len(ev), ev)
	}
	_ = brw.Flush()
}

// faultStallAfter sends SSE headers and events, then stays silent until the
// proxy gives up.
func faultStallAfter(events []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, events, 0)
		<-r.Context().Done()
	}
}

// faultStallFor writes events, stalls for d (as a provider whose server
// hangs mid-answer does), then writes the rest; it ends at once when the
// proxy drops the connection.
func faultStallFor(events []string, d time.Duration, rest []string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeStream(w, events, 0)
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
		for _, ev := range rest {
			if _, err := io.WriteString(w, ev); err != nil {
				return
			}
		}
		_ = http.NewResponseController(w).Flush()
	}
}

// faultPieces writes an SSE response as the given raw pieces, flushing
// each, with the pause before piece i taken from pauses[i] (missing = 0).
func faultPieces(pieces []string, pauses map[int]time.Duration, hdr ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i, p := range pieces {
			if d := pauses[i]; d > 0 {
				select {
				case <-time.After(d):
				case <-r.Context().Done():
					return
				}
			}
			if _, err := io.WriteString(w, p); err != nil {
				return
			}
			_ = rc.Flush()
		}
	}
}

// faultTrickle streams events gap apart until the proxy goes away; it never
// finishes on its own.
func faultTrickle(gap time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i := 0; ; i++ {
			if _, err := io.WriteString(w, faultEvents(1, fmt.Sprintf("t%d", i))[0]); err != nil {
				return
			}
			_ = rc.Flush()
			select {
			case <-time.After(gap):
			case <-r.Context().Done():
				return
			}
		}
	}
}

// faultEventually polls cond every 50ms (a /metrics scrape is not cheap on
// a loaded machine) until it holds or within passes.
func faultEventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
