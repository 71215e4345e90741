package integration

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
)

// completionEvents is a legacy completions stream as vLLM sends it.
var completionEvents = []string{
	`data: {"id":"cmpl-s","object":"text_completion","created":1,"model":"real-model","choices":[{"index":0,"text":"4","logprobs":null,"finish_reason":null}]}` + "\n\n",
	`data: {"id":"cmpl-s","object":"text_completion","created":1,"model":"real-model","choices":[{"index":0,"text":"2","logprobs":null,"finish_reason":"stop"}]}` + "\n\n",
	"data: [DONE]\n\n",
}

// nativeEmbedCompletions serves /v1/embeddings and /v1/completions (stream
// or not) natively.
func nativeEmbedCompletions(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasSuffix(r.URL.Path, "/embeddings"):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,0.25]}],"model":"real-model","usage":{"prompt_tokens":1,"total_tokens":1}}`)
	case isStream(r):
		writeStream(w, completionEvents, 0)
	default:
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"real-model","choices":[{"index":0,"text":"42","finish_reason":"stop","logprobs":null}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}
}

// TestEmbeddingsCompletionsFailover: two native upstreams, the first
// failing with 500: embeddings and completions (stream and not) fail over
// to the second through the OpenAI SDK, and the completions stream reaches
// the client byte for byte.
func TestEmbeddingsCompletionsFailover(t *testing.T) {
	bad := newUpstream(t, status(500))
	good := newUpstream(t, nativeEmbedCompletions)
	p := startProxy(t, frontsConfig([]*fakeUpstream{bad, good}, []bool{true, true}))
	c := responsesClient(p)
	e, err := c.Embeddings.New(context.Background(), openai.EmbeddingNewParams{Model: "m", Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hi")}})
	if err != nil || len(e.Data) != 1 || e.Data[0].Embedding[0] != 0.5 {
		t.Fatalf("embeddings %+v %v", e, err)
	}
	co, err := c.Completions.New(context.Background(), openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("6*7=")}})
	if err != nil || co.Choices[0].Text != "42" {
		t.Fatalf("completions %+v %v", co, err)
	}
	st := c.Completions.NewStreaming(context.Background(), openai.CompletionNewParams{Model: "m", Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("6*7=")}})
	var text string
	for st.Next() {
		text += st.Current().Choices[0].Text
	}
	if st.Err() != nil || text != "42" {
		t.Fatalf("completions stream %q %v", text, st.Err())
	}
	if n := len(bad.Calls()); n != 3 {
		t.Fatalf("first upstream got %d calls, want 3 (one per request)", n)
	}

	resp, err := testClient.Post(p.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"6*7=","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != strings.Join(completionEvents, "") {
		t.Fatalf("completions stream not byte for byte:\n%q", got)
	}
}
