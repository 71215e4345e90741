package llmroute

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		hdr  http.Header
		want time.Duration
		ok   bool
	}{
		{http.Header{}, 0, false},
		{http.Header{"Retry-After": {"15"}}, 15 * time.Second, true},
		{http.Header{"Retry-After": {"0"}}, 0, true},
		{http.Header{"Retry-After": {"1.5"}}, 1500 * time.Millisecond, true},
		{http.Header{"Retry-After": {"-3"}}, 0, false},
		{http.Header{"Retry-After": {"1e10"}}, 0, false},
		{http.Header{"Retry-After": {"soon"}}, 0, false},
		{http.Header{"Retry-After": {now.Add(90 * time.Second).Format(http.TimeFormat)}}, 90 * time.Second, true},
		{http.Header{"Retry-After": {now.Add(-time.Minute).Format(http.TimeFormat)}}, -time.Minute, true},
		{http.Header{"Retry-After-Ms": {"250"}, "Retry-After": {"9"}}, 250 * time.Millisecond, true},
		{http.Header{"Retry-After-Ms": {"x"}, "Retry-After": {"9"}}, 9 * time.Second, true},
		{http.Header{"Retry-After-Ms": {"-1"}}, 0, false},
	} {
		got, ok := parseRetryAfter(tc.hdr, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%v) = %v, %v; want %v, %v", tc.hdr, got, ok, tc.want, tc.ok)
		}
	}
}

func TestStatusClassification(t *testing.T) {
	for _, tc := range []struct {
		code     int
		failover bool
		result   string
	}{
		{200, false, "ok"}, {204, false, "ok"}, {400, false, "4xx"}, {404, true, "4xx"}, {405, true, "4xx"}, {422, false, "4xx"},
		{401, true, "auth_err"}, {403, true, "auth_err"}, {402, true, "402"}, {429, true, "429"},
		{500, true, "5xx"}, {503, true, "5xx"}, {529, true, "5xx"},
	} {
		if got := failoverStatus(tc.code); got != tc.failover {
			t.Errorf("failoverStatus(%d) = %v", tc.code, got)
		}
		if got := statusResult(tc.code); got != tc.result {
			t.Errorf("statusResult(%d) = %q, want %q", tc.code, got, tc.result)
		}
	}
}

func TestRedactSecrets(t *testing.T) {
	in := `{"error":{"message":"Incorrect API key provided: sk-proj-abc123DEF456. Header Bearer tok.en-1 or AIzaSyA1234567890abcdef or op-key-literal, account acme"}}`
	got := redactSecrets(in, "Bearer op-key-literal")
	for _, secret := range []string{"sk-proj-abc123DEF456", "tok.en-1", "AIzaSyA1234567890abcdef", "op-key-literal"} {
		if strings.Contains(got, secret) {
			t.Errorf("%q survived: %s", secret, got)
		}
	}
	if !strings.Contains(got, "Incorrect API key provided") || !strings.Contains(got, "account acme") {
		t.Errorf("the message itself was lost: %s", got)
	}
}

func TestClassifyPath(t *testing.T) {
	for _, tc := range []struct {
		path  string
		front front
		id    string
	}{
		{"/v1/chat/completions", frontChat, ""},
		{"/openai/v1/chat/completions", frontChat, ""},
		{"/v1/models", frontModels, ""},
		{"/v1/models/qwen/qwen3-32b", frontModel, "qwen/qwen3-32b"},
		{"/v1/models/", frontUnsupported, ""},
		{"/v1/embeddings", frontEmbeddings, ""},
		{"/v1/messages", frontMessages, ""},
		{"/v1/messages/count_tokens", frontCountTokens, ""},
		{"/v1/responses", frontResponses, ""},
		{"/v1/completions", frontCompletions, ""},
		{"/v1/foo", frontUnsupported, ""},
		{"/v1", frontUnsupported, ""},
		{"/v1x/models", frontNone, ""},
		{"/assets/models/car.glb", frontNone, ""},
		{"/static/3d/models", frontNone, ""},
		{"/api/chat/completions", frontNone, ""},
		{"/", frontNone, ""},
		{"/index.html", frontNone, ""},
		// The site root (or a stripped mount) is an API root too.
		{"/chat/completions", frontChat, ""},
		{"/responses", frontResponses, ""},
		{"/messages/count_tokens", frontCountTokens, ""},
		{"/models", frontModels, ""},
		{"/models/m", frontModel, "m"},
		{"/models/", frontNone, ""},
	} {
		f, _, id, _ := classifyPath(tc.path)
		if f != tc.front || id != tc.id {
			t.Errorf("classifyPath(%q) = %v %q, want %v %q", tc.path, f, id, tc.front, tc.id)
		}
	}
}

func TestNotFoundHint(t *testing.T) {
	for _, tc := range []struct {
		base, model, body string
		want, not         string
	}{
		{"http://127.0.0.1:9004", "qwen3", "404 page not found", "does the provider url end in /v1? (http://127.0.0.1:9004/v1)", "model"},
		{"http://127.0.0.1:9004/v1", "qwen3", `{"detail":"Not Found"}`, "check the provider url", "/v1?"},
		{"http://127.0.0.1:11434/v1", "qwen3:32b", `{"error":{"message":"model \"qwen3:32b\" not found, try pulling it first"}}`, `model "qwen3:32b"`, "/v1?"},
		{"http://127.0.0.1:8000/v1", "m", `{"object":"error","message":"The model ` + "`m`" + ` does not exist.","code":404}`, `model "m"`, "/v1?"},
	} {
		got := notFoundHint(tc.base, tc.model, []byte(tc.body))
		if !strings.Contains(got, tc.want) || strings.Contains(got, tc.not) {
			t.Errorf("notFoundHint(%q, %q, %q) = %q, want %q and not %q", tc.base, tc.model, tc.body, got, tc.want, tc.not)
		}
	}
}

func TestRefusalReasonsAreBounded(t *testing.T) {
	if got := refusalReason("something_new"); got != "other" {
		t.Errorf("unknown code → %q, want other", got)
	}
	for _, e := range []apiError{errBadJSON, errNoModel, errReadBody, errDuplicateKey, errAllBusy, errAllFailed,
		errQueueFull, errUpstreamAuth, errUpstreamNotFound, errUnsupported, errCORSOrigin, errQueueTimeout,
		errInvalidKey, errUnknownModel("x"), errTooLarge(1), errMethod("POST"), errAllCooling(1),
		errModelNotAllowed("x"), errRateLimited(time.Second), errContextTooLong(1), errNoAPI("x", apiChat)} {
		if refusalReason(e.code) == "other" {
			t.Errorf("code %q has no reason of its own", e.code)
		}
	}
}

// TestClientsNotFound: a 404 about something the client named goes back to
// it; one about the config (the url, the model name) fails over.
func TestClientsNotFound(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   bool
	}{
		{404, `{"error":{"message":"Previous response with id 'resp_1' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, true},
		{404, `{"error":{"message":"bad request 404: max_tokens too large","type":"invalid_request_error","param":"max_tokens","code":null}}`, true},
		{404, `{"error":{"message":"No such File object: file-1","type":"invalid_request_error","param":null,"code":"file_not_found"}}`, true},
		{404, `{"error":{"message":"The model 'x' does not exist","type":"invalid_request_error","param":"model","code":"model_not_found"}}`, false},
		{404, `{"error":{"message":"The model 'x' does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}`, false},
		{404, `{"error":"model \"x\" not found, try pulling it first"}`, false},
		{404, `{"type":"error","error":{"type":"not_found_error","message":"model: claude-x"}}`, false},
		{404, `404 page not found`, false},
		{405, `{"error":{"param":"previous_response_id","code":"previous_response_not_found"}}`, false},
	} {
		if got := clientsNotFound(tc.status, []byte(tc.body)); got != tc.want {
			t.Errorf("clientsNotFound(%d, %s) = %v, want %v", tc.status, tc.body, got, tc.want)
		}
	}
}
