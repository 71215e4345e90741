package llmroute

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchStream is the whole streaming request path in-process, as
// BenchmarkServeHTTP is the non-streaming one: a stream of events passed
// through to the client from an upstream with the given apis.
func benchStream(b *testing.B, apis, path string, events []string, reqBody string, modelFields ...string) {
	body := []byte(strings.Join(events, ""))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			_, _ = w.Write([]byte(`{"object":"list","data":[]}`))
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write(body)
	}))
	defer up.Close()
	h := provisionBench(b, `{"providers": [{"id": "sb-p", "url": "`+up.URL+`/v1", "key": "sk-bench"}],
		"upstreams": [{"id": "sb-u", "provider": "sb-p", "model": "real-model", "max_concurrency": 64`+apis+`}],
		"models": [{"name": "m", "upstreams": ["sb-u"]`+strings.Join(modelFields, "")+`}]}`)
	serve := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(reqBody))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		if err := h.ServeHTTP(rec, req, nextNotCalled); err != nil {
			b.Fatal(err)
		}
		return rec
	}
	if rec := serve(); rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), body) {
		b.Fatalf("status %d body %q", rec.Code, rec.Body)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		serve()
	}
}

// BenchmarkServeHTTPStream: a 20-token chat stream.
func BenchmarkServeHTTPStream(b *testing.B) {
	var ev []string
	for i := 0; i < 20; i++ {
		ev = append(ev, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}`+"\n\n")
	}
	ev = append(ev, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")
	benchStream(b, "", "/v1/chat/completions", ev, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
}

// BenchmarkServeHTTPStreamGuard: a 24-token chat stream of varied words
// (no loop), with the model's repeat guard off and on.
func BenchmarkServeHTTPStreamGuard(b *testing.B) {
	words := strings.Fields("Measure first: profile the proxy under the same load, compare the allocation views, and only then change the hot path, one thing at a time, re-running.")
	var ev []string
	for i := 0; i < 24; i++ {
		ev = append(ev, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{"content":" `+words[i%len(words)]+`"},"finish_reason":null}]}`+"\n\n")
	}
	ev = append(ev, `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"real-model","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`+"\n\n", "data: [DONE]\n\n")
	req := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	b.Run("off", func(b *testing.B) { benchStream(b, "", "/v1/chat/completions", ev, req) })
	b.Run("on", func(b *testing.B) { benchStream(b, "", "/v1/chat/completions", ev, req, `, "repeat_guard": "on"`) })
}

// BenchmarkServeHTTPMessagesStream: a 20-token Messages stream from an
// upstream that speaks Messages (native).
func BenchmarkServeHTTPMessagesStream(b *testing.B) {
	ev := []string{"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"real-model\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
		"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"}
	for i := 0; i < 20; i++ {
		ev = append(ev, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"tok \"}}\n\n")
	}
	ev = append(ev, "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":20}}\n\n",
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	benchStream(b, `, "apis": ["chat","messages"]`, "/v1/messages", ev, `{"model":"m","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`)
}
