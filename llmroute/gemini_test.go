package llmroute

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The Gemini paths: found under a /v1beta segment anywhere (a mount), the
// model everything between /models/ and the verb (slashes included), and
// under /v1 only a served verb, so OpenAI's model paths stay OpenAI's.
func TestClassifyGeminiPath(t *testing.T) {
	for _, tc := range []struct {
		path   string
		front  front
		id     string
		allow  string
		stream bool
	}{
		{"/v1beta/models/gemini-3.8-flash:generateContent", frontGemini, "gemini-3.8-flash", "POST", false},
		{"/v1beta/models/gemini-3.8-flash:streamGenerateContent", frontGemini, "gemini-3.8-flash", "POST", true},
		{"/v1beta/models/a/b:streamGenerateContent", frontGemini, "a/b", "POST", true},
		{"/v1beta/models/m:countTokens", frontGeminiCount, "m", "POST", false},
		{"/v1/models/x:countTokens", frontGeminiCount, "x", "POST", false},
		{"/v1/models/org/x:generateContent", frontGemini, "org/x", "POST", false},
		{"/llm/v1beta/models", frontGeminiModels, "", "GET, HEAD", false},
		{"/llm/v1beta/models/m:generateContent", frontGemini, "m", "POST", false},
		{"/v1beta/models", frontGeminiModels, "", "GET, HEAD", false},
		{"/v1beta/models/m", frontGeminiModels, "m", "GET, HEAD", false},
		{"/v1beta/models/qwen3:8b", frontGeminiModels, "qwen3:8b", "GET, HEAD", false},
		{"/v1beta/models/m:embedContent", frontGeminiModels, "m:embedContent", "GET, HEAD", false},
		{"/v1beta/models/", frontGeminiUnsupported, "", "", false},
		{"/v1beta/models/:generateContent", frontGeminiModels, ":generateContent", "GET, HEAD", false},
		{"/v1beta/foo", frontGeminiUnsupported, "", "", false},
		{"/v1beta", frontGeminiUnsupported, "", "", false},
		// Not Gemini's: OpenAI's model paths (an Ollama tag has a colon),
		// the site root without a version, a segment that only starts so.
		{"/v1/models", frontModels, "", "GET, HEAD", false},
		{"/v1/models/llama3:8b", frontModel, "llama3:8b", "GET, HEAD", false},
		{"/v1/models/x:embedContent", frontModel, "x:embedContent", "GET, HEAD", false},
		{"/models/m:generateContent", frontModel, "m:generateContent", "GET, HEAD", false},
		{"/v1betax/models", frontNone, "", "", false},
		{"/v1betax/v1beta/models", frontGeminiModels, "", "GET, HEAD", false},
	} {
		f, allow, id, _ := classifyPath(tc.path)
		if f != tc.front || id != tc.id || allow != tc.allow {
			t.Errorf("classifyPath(%q) = %v %q %q, want %v %q %q", tc.path, f, id, allow, tc.front, tc.id, tc.allow)
		}
		m, stream, ok := geminiCodec{}.pathTarget(tc.path)
		wantOK := tc.front == frontGemini || tc.front == frontGeminiCount
		if ok != wantOK || ok && (m != tc.id || stream != tc.stream) {
			t.Errorf("pathTarget(%q) = %q %v %v, want %q %v %v", tc.path, m, stream, ok, tc.id, tc.stream, wantOK)
		}
	}
}

// A native Gemini stream ends with a chunk carrying "finishReason" (the
// member name differs from chat's), found wherever the writes split it;
// chat's finish_reason does not count there, nor does the word in text.
func TestFinishScannerGemini(t *testing.T) {
	last := `data: {"candidates":[{"content":{"parts":[{"text":"!"}],"role":"model"},"finishReason": "STOP","index":0}],"usageMetadata":{"promptTokenCount":3}}` + "\r\n\r\n"
	cases := []struct {
		name, stream string
		want         bool
	}{
		{"final", `data: {"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"index":0}]}` + "\r\n\r\n" + last, true},
		{"none yet", `data: {"candidates":[{"content":{"parts":[{"text":"Hi"}],"role":"model"},"index":0}]}` + "\r\n\r\n", false},
		{"in text", `data: {"candidates":[{"content":{"parts":[{"text":"say \"finishReason\":\"STOP\""}],"role":"model"},"index":0}]}` + "\r\n\r\n", false},
		{"chat's member", `data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}` + "\r\n\r\n", false},
	}
	for _, c := range cases {
		for cut1 := 0; cut1 <= len(c.stream); cut1++ {
			for _, cut2 := range []int{cut1, min(cut1+1, len(c.stream)), min(cut1+9, len(c.stream))} {
				f := finishScanner{key: geminiShape.finishKey}
				f.scan([]byte(c.stream[:cut1]))
				f.scan([]byte(c.stream[cut1:cut2]))
				f.scan([]byte(c.stream[cut2:]))
				if f.seen != c.want {
					t.Fatalf("%s split at %d, %d: seen %v, want %v", c.name, cut1, cut2, f.seen, c.want)
				}
			}
		}
	}
}

// Google's key in the URL is taken out of the query and the RequestURI,
// the other parameters kept; a parameter that only ends in "key" stays.
func TestStripKeyQuery(t *testing.T) {
	for _, tc := range []struct {
		target, key, query, uri string
	}{
		{"/v1beta/models/m:streamGenerateContent?alt=sse&key=sekrit", "sekrit", "alt=sse", "/v1beta/models/m:streamGenerateContent?alt=sse"},
		{"/v1beta/models/m:generateContent?key=sekrit", "sekrit", "", "/v1beta/models/m:generateContent"},
		{"/v1beta/models?key=a%2Bb&pageSize=50", "a+b", "pageSize=50", "/v1beta/models?pageSize=50"},
		{"/v1beta/models?monkey=1", "", "monkey=1", "/v1beta/models?monkey=1"},
		{"/v1beta/models", "", "", "/v1beta/models"},
	} {
		r := httptest.NewRequest(http.MethodGet, tc.target, nil)
		key := stripKeyQuery(r)
		if key != tc.key || r.URL.RawQuery != tc.query || r.RequestURI != tc.uri {
			t.Errorf("%s: key %q query %q uri %q, want %q %q %q", tc.target, key, r.URL.RawQuery, r.RequestURI, tc.key, tc.query, tc.uri)
		}
	}
}

func TestGeminiStreamSSE(t *testing.T) {
	for q, want := range map[string]bool{"alt=sse": true, "key=x&alt=sse": true, "alt=json": false, "": false, "salt=sse": false} {
		if got := geminiStreamSSE(q); got != want {
			t.Errorf("geminiStreamSSE(%q) = %v", q, got)
		}
	}
}

// The upstream's model goes into its URLs escaped per segment, Google's
// resource prefix not doubled.
func TestGeminiModelURL(t *testing.T) {
	for model, want := range map[string]string{
		"gemini-2.5-flash":        "https://g/v1beta/models/gemini-2.5-flash",
		"models/gemini-2.5-flash": "https://g/v1beta/models/gemini-2.5-flash",
		"org/my model":            "https://g/v1beta/models/org/my%20model",
	} {
		if got := geminiModelURL("https://g/v1beta", model); got != want {
			t.Errorf("%q: %s, want %s", model, got, want)
		}
	}
}

// The proxy's error event after a native Gemini stream broke mid-event is
// Google's data event, and the half-written event before it is closed with
// Google's "\r\n\r\n": a client splitting on the first blank line would
// otherwise read the two as one.
func TestGeminiErrorEventFraming(t *testing.T) {
	for _, tc := range []struct {
		name, written, gap string
	}{
		{"at a boundary", "data: {\"candidates\":[]}\r\n\r\n", ""},
		{"mid-event", "data: {\"candidates\":[", "\r\n\r\n"},
	} {
		rec := httptest.NewRecorder()
		var c clientWriter
		c.init(rec, true, true, 0, time.Time{}, false)
		c.shape = &geminiShape
		if _, err := c.Write([]byte(tc.written)); err != nil {
			t.Fatal(err)
		}
		c.writeError(codeInterrupted)
		want := tc.written + tc.gap + `data: {"error":{"code":503,"message":"the upstream stream was interrupted before it finished","status":"UNAVAILABLE",` +
			`"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"stream_interrupted","domain":"llm_route"}]}}` + "\r\n\r\n"
		if got := rec.Body.String(); got != want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, want)
		}
	}
}
